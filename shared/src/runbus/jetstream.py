"""JetStream setup every service shares: make a stream or bucket exist with the wanted config
(idempotent across replicas starting at once), and wait for a KV watcher's next entry."""

import asyncio
from dataclasses import replace

import nats.errors
from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue

from .progress import retrying


def jetstream_down(exc: Exception) -> str | None:
    """Why JetStream could not be used, if it is a wait-and-retry failure (it is not enabled
    yet, a leader election, a server that is slow to answer); None for any other failure."""
    match exc:
        case nats.errors.TimeoutError() | nats.errors.NoRespondersError():
            return f"JetStream did not answer ({type(exc).__name__}) on RUNBUS_NATS_URL's server"
        case ServiceUnavailableError():
            return f"JetStream is unavailable on RUNBUS_NATS_URL's server ({exc})"
        case _:
            return None


async def ensure_stream(nc: NATS, config: StreamConfig) -> None:
    """Create the stream, or bring an existing one to `config`; while JetStream does not
    answer, say so (start-up progress) and try again."""
    await retrying(
        f"waiting for JetStream (stream {config.name})",
        lambda: _ensure_stream(nc, config),
        down=jetstream_down,
    )


async def _ensure_stream(nc: NATS, config: StreamConfig) -> None:
    js = nc.jetstream()
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.update_stream(config)


async def open_bucket(
    nc: NATS,
    bucket: str,
    *,
    replicas: int = 1,
    ttl: float | None = None,
    history: int = 1,
    description: str | None = None,
) -> KeyValue:
    """The KV bucket, created on first use; an existing one gets at least `replicas`.

    Replicas are raised, never lowered: a deployment that moves to a cluster and sets
    `RUNBUS_STREAM_REPLICAS=3` must not keep single-replica buckets from its first start.
    While JetStream does not answer, it says so (start-up progress) and tries again.
    """
    return await retrying(
        f"waiting for JetStream (bucket {bucket})",
        lambda: _open_bucket(
            nc, bucket, replicas=replicas, ttl=ttl, history=history, description=description
        ),
        down=jetstream_down,
    )


async def _open_bucket(
    nc: NATS,
    bucket: str,
    *,
    replicas: int,
    ttl: float | None,
    history: int,
    description: str | None,
) -> KeyValue:
    js = nc.jetstream()
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError:
        try:
            return await js.create_key_value(
                bucket=bucket,
                history=history,
                ttl=ttl,
                replicas=replicas,
                direct=True,
                description=description,
            )
        except BadRequestError:  # another replica created it a moment ago
            return await js.key_value(bucket)
    stream = await js.stream_info(f"KV_{bucket}")
    more_replicas = (stream.config.num_replicas or 1) < replicas
    # A bucket from an earlier version may lack direct gets: reads through the stream API cost
    # the server a JSON request, a base64 reply and an audit advisory each.
    if more_replicas or not stream.config.allow_direct:
        wanted = max(stream.config.num_replicas or 1, replicas)
        await js.update_stream(replace(stream.config, num_replicas=wanted, allow_direct=True))
        kv = await js.key_value(bucket)  # bound again: it reads by direct get from now on
    if more_replicas:
        await _wait_for_replicas(nc, f"KV_{bucket}", replicas)
    return kv


async def _wait_for_replicas(nc: NATS, stream: str, replicas: int, timeout: float = 30.0) -> None:
    """Until the stream's new peers have caught up: writes time out while it re-places."""
    js = nc.jetstream()
    async with asyncio.timeout(timeout):
        while True:
            cluster = (await js.stream_info(stream)).cluster
            peers = (cluster.replicas or []) if cluster else []
            placed = cluster is not None and cluster.leader and len(peers) >= replicas - 1
            if placed and all(peer.current for peer in peers):
                return
            await asyncio.sleep(0.1)


async def next_update(watcher: KeyValue.KeyWatcher, timeout: float) -> KeyValue.Entry | None:
    """The watcher's next entry (None once it has caught up); `nats.errors.TimeoutError` if
    none comes within `timeout`.

    nats-py waits with `asyncio.wait_for`, which on Python 3.11 drops a cancel that arrives
    together with an entry. The task still counts that cancel, so it is raised here: a
    cancelled waiter (a run cancelled while it waits for an approval) stops instead of
    waiting on.
    """
    try:
        entry: KeyValue.Entry | None = await watcher.updates(timeout=timeout)  # type: ignore[no-untyped-call]
    except TimeoutError:
        _raise_dropped_cancel()
        raise
    _raise_dropped_cancel()
    return entry


def _raise_dropped_cancel() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
