"""What a client with valid credentials may aim the bus's answers at: bob (another user of
alice's tenant) and carol (another tenant) steering API replies onto alice's live events, and
creating consumers of the events stream that deliver onto alice's or the services' subjects.

NATS has no permission on the reply subject of a publish: a client may name any subject as
its reply, and the answer is delivered in the clients' account on that subject. It reaches
nobody there, because a client may subscribe only under its own inbox prefix (secret: derived
from its token) and reads its live events through a consumer delivering into it. A consumer's
deliver subject is checked by the auth service before JetStream sees the creation: only an
inbox of the user whose events it reads is accepted."""

import json
from collections.abc import AsyncIterator
from typing import Final

import pytest
from nats.aio.client import Client as NATS

import runbus.client
from runbus import headers as h
from runbus import subjects
from runbus.client import RunbusClient
from runbus.messages import RunCompleted
from runbus.tokens import token_digest
from tests.helpers import eventually
from tests.stack import SecuredNats, Stack

INTRUDERS: Final = {"bob": ("acme", "bob"), "carol": ("globex", "carol")}


@pytest.fixture(params=sorted(INTRUDERS))
async def intruder(
    request: pytest.FixtureRequest, stack: Stack, nats_server: SecuredNats
) -> AsyncIterator[tuple[str, NATS]]:
    name: str = request.param
    nc = await runbus.client.open_connection(nats_server.client_url, f"dev-{name}")
    yield name, nc
    await nc.drain()


async def steer(intruder: tuple[str, NATS], target: str) -> None:
    """API requests of the intruder's own, answered onto `target`; returns once a request
    made after them is answered (each was handled by then)."""
    name, nc = intruder
    auth = {h.AUTH: f"Bearer dev-{name}"}
    for body in (b'{"type": "sessions.list"}', b'{"type": "runs.list"}', b"not json"):
        await nc.publish(subjects.api("sessions.list"), body, reply=target, headers=auth)
    await nc.request(
        subjects.api("sessions.list"), b'{"type": "sessions.list"}', headers=auth, timeout=10
    )


async def test_replies_another_user_steers_onto_alice_s_events_or_cancel_leave_her_run_alone(
    intruder: tuple[str, NATS], nats_server: SecuredNats
) -> None:
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        run_id = "r-steered"
        events = alice.stream("travel", "Weather in Sydney?", session_id="s-steered", run_id=run_id)
        first = await anext(events)
        await steer(intruder, subjects.events("acme", "alice", run_id))
        await steer(intruder, subjects.run_cancel("acme", "alice", run_id))
        seen = [first, *[event async for event in events]]
        stored = [item.event async for item in alice.follow(run_id)]

    assert isinstance(seen[-1], RunCompleted)
    assert seen == stored


async def test_a_reply_another_user_steers_onto_alice_s_events_subject_never_reaches_her(
    intruder: tuple[str, NATS], nats_server: SecuredNats
) -> None:
    refusals: list[str] = []

    async def on_error(exc: Exception) -> None:
        refusals.append(str(exc).lower())

    alice = await runbus.client.open_connection(
        nats_server.client_url, "dev-alice", error_cb=on_error
    )
    try:
        me = await RunbusClient(alice, token="dev-alice").identity()
        target = subjects.events("acme", "alice", "r-listened")
        listening = await alice.subscribe(target)
        inbox = await alice.subscribe(f"{me.inbox_prefix}.>")
        await alice.flush()
        await eventually(lambda: any("permissions violation" in e for e in refusals))
        await steer(intruder, target)
        await steer(intruder, subjects.owner_events("acme", "alice").replace(">", "*"))
        await alice.flush()
        arrived = listening.pending_msgs + inbox.pending_msgs
    finally:
        await alice.close()  # a drain would wait for someone to read what arrived

    assert arrived == 0
    assert any(target in refusal for refusal in refusals), refusals


async def test_a_consumer_another_user_creates_cannot_deliver_onto_alice_s_or_the_services_subjects(
    intruder: tuple[str, NATS],
) -> None:
    name, nc = intruder
    tenant, user = INTRUDERS[name]
    own = subjects.owner_events(tenant, user)
    create = subjects.consumer_create(subjects.EVENTS_STREAM, own, subjects.CLIENT_JS_API)
    targets = {
        "alice's cancel": subjects.run_cancel("acme", "alice", "r-1"),
        "alice's events": subjects.events("acme", "alice", "r-1"),
        "alice's inbox": subjects.client_inbox_prefix(token_digest("dev-alice")) + ".x",
        "a made-up inbox": subjects.client_inbox_prefix("0" * 32) + ".x",
        "every inbox": subjects.client_inbox_prefix(token_digest(f"dev-{name}")) + ".*",
        "the inbox root": subjects.client_inbox_prefix(token_digest(f"dev-{name}")),
        "the services' inbox": f"{subjects.SERVICE_INBOX_PREFIX}.x",
        "a KV bucket": f"$KV.{subjects.RUN_STATE_BUCKET}.x",
        "a run request": subjects.runs("travel"),
        "a service API": subjects.api("runs.cancel"),
    }
    accepted = []
    for index, (what, deliver) in enumerate(targets.items()):
        body = {
            "stream_name": subjects.EVENTS_STREAM,
            "config": {
                "name": f"c-{name}-{index}",
                "filter_subject": own,
                "deliver_subject": deliver,
            },
        }
        reply = await nc.request(
            create.replace("*", f"c-{name}-{index}"), json.dumps(body).encode(), timeout=10
        )
        if b'"error"' not in reply.data:
            accepted.append(what)

    assert accepted == []


async def test_a_consumer_delivering_into_the_user_s_own_inbox_is_accepted(
    intruder: tuple[str, NATS],
) -> None:
    name, nc = intruder
    tenant, user = INTRUDERS[name]
    client = RunbusClient(nc, token=f"dev-{name}")
    own = subjects.owner_events(tenant, user)
    create = subjects.consumer_create(subjects.EVENTS_STREAM, own, subjects.CLIENT_JS_API)
    body = {
        "stream_name": subjects.EVENTS_STREAM,
        "config": {
            "name": f"c-{name}-own",
            "filter_subject": own,
            "deliver_subject": nc.new_inbox(),
        },
    }

    reply = await nc.request(create.replace("*", f"c-{name}-own"), json.dumps(body).encode())
    me = await client.identity()

    assert b'"error"' not in reply.data, reply.data
    assert json.loads(reply.data)["config"]["deliver_subject"].startswith(me.inbox_prefix)


async def test_a_consumer_of_the_user_s_own_events_cannot_add_alice_s_as_a_second_filter(
    intruder: tuple[str, NATS],
) -> None:
    name, nc = intruder
    tenant, user = INTRUDERS[name]
    own = subjects.owner_events(tenant, user)
    create = subjects.consumer_create(subjects.EVENTS_STREAM, own, subjects.CLIENT_JS_API)
    body = {
        "stream_name": subjects.EVENTS_STREAM,
        "config": {
            "name": f"c-{name}-two",
            "filter_subjects": [own, subjects.owner_events("acme", "alice")],
            "deliver_subject": nc.new_inbox(),
        },
    }

    reply = await nc.request(create.replace("*", f"c-{name}-two"), json.dumps(body).encode())

    assert b'"error"' in reply.data, reply.data
