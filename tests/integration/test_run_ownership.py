"""A run belongs to its owner from admission on: users of the same and of another tenant, with
valid credentials, decide her approval, cancel and read her run, each getting `not_found`; the
same run id from them is a run of their own, which neither drops nor touches hers. Alice's
run, record, events and booking stay hers."""

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import HistoryLoad, ModelRequest, RunCompleted, RunEvent, RunFailed
from runbus.messages.runs import (
    ApprovalDecide,
    RunCancel,
    RunGet,
)
from runbus.tokens import run_msg_id
from runbus_examples import AGENTS_DIR
from runbus_examples.travel import ledger
from runbus_gateway.agents import load_agents
from tests.helpers import approval_requested, eventually, raw_request
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}
WINDOW = 0.5
"""The run queue's duplicate window here: long enough to drop a quick re-publish, short enough
to test what a re-publish after it meets."""


def book(request: ModelRequest, step: int) -> Any:
    if step == 0:
        return call("create_booking", "c-book", flight_id="QF412-20261208", cabin="business")
    result = [r for m in request.messages for r in m.function_results][-1]
    return text(f"Outcome: {result.error or result.result}")


async def _stored_events(
    nc: NATS, run_id: str, tenant: str = "*", user_id: str = "*"
) -> list[tuple[str, str, dict[str, Any]]]:
    """Every stored event of that run id on one owner's events subject (default: every
    owner's): (tenant, user, body)."""
    js = nc.jetstream()
    subject = subjects.events(tenant, user_id, run_id)
    info = await js.stream_info(subjects.EVENTS_STREAM, subjects_filter=subject)
    stored = sum((info.state.subjects or {}).values())
    subscription = await js.subscribe(subject, stream=subjects.EVENTS_STREAM, ordered_consumer=True)
    events = []
    for _ in range(stored):
        msg = await subscription.next_msg(timeout=5)
        headers = msg.headers or {}
        events.append(
            (
                headers.get("rb-prop-tenant", ""),
                headers.get("rb-prop-user_id", ""),
                json.loads(msg.data),
            )
        )
    await subscription.unsubscribe()
    return events


async def _publish_as(
    client: RunbusClient, run_id: str, *, msg_id: str, session_id: str = "mine"
) -> bool:
    """Publish a run request as the client's user; False when JetStream dropped it as a
    duplicate of an earlier `Nats-Msg-Id`."""
    ack = await client.nc.jetstream().publish(
        subjects.runs("travel"),
        raw_request(run_id, "Book it for me", session_id=session_id),
        headers={"rb-auth": f"Bearer {client.token}", "Nats-Msg-Id": msg_id},
    )
    return not ack.duplicate


async def _own_failure(client: RunbusClient, user: str, run_id: str) -> dict[str, Any]:
    """The `run.failed` the gateway published for `user`'s request with `run_id`."""
    found: list[dict[str, Any]] = []

    async def failed() -> bool:
        found[:] = [
            body
            for _, who, body in await _stored_events(client.nc, run_id)
            if who == user and body["type"] == "run.failed"
        ]
        return bool(found)

    await eventually(failed, timeout=20)
    [event] = found
    return event


async def test_another_owner_can_neither_reuse_nor_steer_a_run_id_and_alice_books_once(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": GatedModel(book)},
        gateway_options={"duplicate_window": WINDOW},
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="trip")
        asked = await approval_requested(alice, run_id)

        # The same run id under another dedupe key: refused before anything is looked up, and
        # answered under the dedupe key the request came with.
        assert await _publish_as(bob, run_id, msg_id=f"{run_id}-x")
        mismatch = await _own_failure(bob, "bob", f"{run_id}-x")
        refused: dict[str, list[str]] = {"bob": [], "carol": []}
        for name, client in (("bob", bob), ("carol", carol)):
            for decision in ("approved", "denied"):
                with pytest.raises(RemoteError) as decided:
                    await client.call(
                        ops.API_APPROVALS_DECIDE,
                        ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision=decision),
                    )
                refused[name].append(decided.value.remote_code)
            with pytest.raises(RemoteError) as cancelled:
                await client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
            refused[name].append(cancelled.value.remote_code)
            with pytest.raises(RemoteError) as got:
                await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
            refused[name].append(got.value.remote_code)

        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved"),
        )
        final = [
            i.event
            async for i in alice.follow(run_id, timeout=20)
            if isinstance(i.event, RunCompleted | RunFailed)
        ]
        before = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip"))
        alice_events = [e for e in await _stored_events(alice.nc, run_id) if e[1] == "alice"]

        # Alice's run id from a user of the same tenant (as a bare id) and from another tenant
        # (with her credential's dedupe key), at once (within the duplicate window): each is a
        # run of its own user's, who is asked for its approval and denies it.
        theirs: dict[str, list[RunEvent]] = {}
        for name, client in (("bob", bob), ("carol", carol)):
            msg_id = run_id if name == "bob" else run_msg_id(client.token, run_id)
            assert await _publish_as(client, run_id, msg_id=msg_id, session_id=f"{name}-trip")
            their_ask = await approval_requested(client, run_id)
            await client.call(
                ops.API_APPROVALS_DECIDE,
                ApprovalDecide(run_id=run_id, call_id=their_ask.call_id, decision="denied"),
            )
            theirs[name] = [
                i.event
                async for i in client.follow(run_id, timeout=20)
                if isinstance(i.event, RunCompleted | RunFailed)
            ]
        after = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        history_after = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip"))
        alice_events_after = [e for e in await _stored_events(alice.nc, run_id) if e[1] == "alice"]
        on_alices_subject = await _stored_events(alice.nc, run_id, "acme", "alice")
        on_their_subjects = {
            user: await _stored_events(alice.nc, run_id, tenant, user)
            for tenant, user in (("acme", "bob"), ("globex", "carol"))
        }

    assert mismatch["error"]["code"] == "bad_request"
    assert "Nats-Msg-Id" in mismatch["error"]["message"]
    assert refused == {"bob": ["not_found"] * 4, "carol": ["not_found"] * 4}
    assert [type(e) for e in final] == [RunCompleted]
    assert {name: [type(e) for e in final] for name, final in theirs.items()} == {
        "bob": [RunCompleted],
        "carol": [RunCompleted],
    }
    assert after.record == before.record
    assert after.record.status == "completed"
    assert (after.record.tenant, after.record.user_id) == ("acme", "alice")
    assert history_after.messages == history.messages
    assert alice_events_after == alice_events
    # What alice follows holds her run's events only; each other run's went to its own user.
    assert on_alices_subject == alice_events
    assert {u: found[-1][2]["type"] for u, found in on_their_subjects.items()} == {
        "bob": "run.completed",
        "carol": "run.completed",
    }
    assert all(e[:2] == ("acme", "bob") for e in on_their_subjects["bob"])
    assert all(e[:2] == ("globex", "carol") for e in on_their_subjects["carol"])
    assert [e[2]["type"] for e in alice_events][-1] == "run.completed"
    [booking] = ledger.bookings(run_id)
    assert (booking.passenger, booking.tenant, booking.approved_by) == ("alice", "acme", "alice")
