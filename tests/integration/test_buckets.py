"""KV buckets as `open_bucket` leaves them: read by direct get, also a bucket an earlier
version created without it (whose reads each cost the server a stream-API request, a base64
reply and an audit advisory)."""

from nats.aio.client import Client as NATS

from runbus.jetstream import open_bucket


async def test_a_new_bucket_is_read_by_direct_get(nc: NATS) -> None:
    kv = await open_bucket(nc, "runbus_direct_new")
    await kv.put("k", b"v")
    info = await nc.jetstream().stream_info("KV_runbus_direct_new")
    assert info.config.allow_direct
    assert (await kv.get("k")).value == b"v"


async def test_an_older_bucket_without_direct_get_gets_it_and_keeps_its_entries(
    nc: NATS,
) -> None:
    old = await nc.jetstream().create_key_value(bucket="runbus_direct_old", history=1)
    await old.put("k", b"v")
    assert not (await nc.jetstream().stream_info("KV_runbus_direct_old")).config.allow_direct

    kv = await open_bucket(nc, "runbus_direct_old")
    info = await nc.jetstream().stream_info("KV_runbus_direct_old")
    assert info.config.allow_direct
    # The handle returned reads by direct get too, not only the stream allows it.
    direct = await nc.subscribe("$JS.API.DIRECT.GET.KV_runbus_direct_old.>")
    through_api = await nc.subscribe("$JS.API.STREAM.MSG.GET.KV_runbus_direct_old")
    assert (await kv.get("k")).value == b"v"
    await nc.flush()
    assert (direct.pending_msgs, through_api.pending_msgs) == (1, 0)
    await direct.unsubscribe()
    await through_api.unsubscribe()
