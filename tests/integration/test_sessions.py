"""Sessions belong to someone; history never duplicates, survives cancels and is repaired;
two runs on one session follow the agent's concurrency policy across gateway replicas."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from runbus import headers as h
from runbus import ops, subjects
from runbus.client import RunbusClient, RunFailedError
from runbus.errors import RemoteError
from runbus.messages import HistoryLoad, RunCompleted, RunFailed
from runbus.messages.memory import MemoryList
from runbus.messages.runs import RunCancel
from runbus.messages.sessions import (
    SessionDelete,
    SessionExport,
    SessionGet,
    SessionImport,
    SessionList,
    SessionStateUpdate,
)
from runbus.ops import Op
from runbus.tokens import TokenVerifier
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import AgentSpec, load_agents
from runbus_gateway.service import GatewayService
from tests.helpers import eventually, publish_and_collect, raw_request, types
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, Stack, start_stack

TRAVEL = load_agents(AGENTS_DIR)["travel"]


def agent(**changes: object) -> AgentSpec:
    return msgspec.structs.replace(TRAVEL, model="gated", **changes)


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


@pytest.fixture
async def bob(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-bob")
    await nc.drain()


async def history_of(client: RunbusClient, session_id: str) -> list[str]:
    loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
    return [m.message_id for m in loaded.messages]


async def test_ten_runs_store_exactly_the_messages_a_user_would_count(
    stack: Stack, alice: RunbusClient
) -> None:
    for n in range(10):
        await alice.run("travel", f"Weather in Perth, number {n}?", session_id="ten")

    ids = await history_of(alice, "ten")

    assert len(ids) == len(set(ids)) == 40  # user, assistant call, tool result, answer, 10 times
    assert ids[:4] == [f"{ids[0].split(':')[0]}:{part}" for part in ("in0", "m0", "t0", "m1")]
    listed = await alice.call(ops.SESSIONS_LIST, SessionList())
    [record] = [r for r in listed.records if r.session_id == "ten"]
    assert record.history_length == 40
    assert record.active_run is None
    assert record.owner == "alice"


@pytest.mark.parametrize(
    "op",
    ["history.load", "sessions.get", "sessions.export", "sessions.delete", "sessions.state.update"],
)
async def test_another_user_cannot_read_change_or_even_detect_a_session(
    stack: Stack, alice: RunbusClient, bob: RunbusClient, nats_server: SecuredNats, op: str
) -> None:
    await alice.run("travel", "Weather in Perth?", session_id="alices")
    requests: dict[str, tuple[Op[Any, Any], msgspec.Struct]] = {
        "history.load": (ops.HISTORY_LOAD, HistoryLoad(session_id="alices")),
        "sessions.get": (ops.SESSIONS_GET, SessionGet(session_id="alices")),
        "sessions.export": (ops.SESSIONS_EXPORT, SessionExport(session_id="alices")),
        "sessions.delete": (ops.SESSIONS_DELETE, SessionDelete(session_id="alices")),
        "sessions.state.update": (
            ops.SESSIONS_STATE_UPDATE,
            SessionStateUpdate(session_id="alices", key="k", value=1),
        ),
    }
    operation, message = requests[op]
    carol_nc = await nats.connect(nats_server.url)
    carol = RunbusClient(carol_nc, token="dev-carol")
    answers = []
    try:
        for intruder in (bob, carol):
            for session_id in ("alices", "nobody-has-this"):
                probe = msgspec.structs.replace(message, session_id=session_id)
                with pytest.raises(RemoteError) as raised:
                    await intruder.call(operation, probe)
                answers.append(
                    (raised.value.remote_code, raised.value.message.replace(session_id, "<id>"))
                )
        # Forged identity headers on the API are ignored: still bob.
        forged = await bob.nc.request(
            ops.api_op(operation).subject,
            msgspec.json.encode(message),
            timeout=5,
            headers={
                "rb-auth": "Bearer dev-bob",
                "rb-prop-user_id": "alice",
                "rb-prop-tenant": "acme",
            },
        )
        assert forged.headers is not None
        assert forged.headers["rb-error"] == "not_found"
    finally:
        await carol_nc.drain()

    # An existing session of someone else and a missing one answer exactly alike.
    assert len(set(answers)) == 1
    assert answers[0][0] == "not_found"
    assert len(await history_of(alice, "alices")) == 4


async def test_export_delete_import_round_trips_a_session_byte_for_byte(
    stack: Stack, alice: RunbusClient
) -> None:
    await alice.run("travel", "Weather in Hobart?", session_id="trip")
    await alice.run("travel", "Remember that I like aisle seats.", session_id="trip")
    await alice.call(
        ops.SESSIONS_STATE_UPDATE,
        SessionStateUpdate(session_id="trip", key="selected_flight", value={"id": "QF1"}),
    )
    exported = await alice.call(ops.SESSIONS_EXPORT, SessionExport(session_id="trip"))
    before = msgspec.json.encode(exported.document)

    await alice.call(ops.SESSIONS_DELETE, SessionDelete(session_id="trip"))
    with pytest.raises(RemoteError, match="no session"):
        await history_of(alice, "trip")
    await alice.call(ops.SESSIONS_IMPORT, SessionImport(document=exported.document))
    again = await alice.call(ops.SESSIONS_EXPORT, SessionExport(session_id="trip"))

    assert msgspec.json.encode(again.document) == before
    assert again.document.record.state == {"selected_flight": {"id": "QF1"}}
    assert len(again.document.messages) == 6


async def test_importing_someone_elses_document_is_refused(
    stack: Stack, alice: RunbusClient, bob: RunbusClient
) -> None:
    await alice.run("travel", "Weather in Hobart?", session_id="mine")
    exported = await alice.call(ops.SESSIONS_EXPORT, SessionExport(session_id="mine"))
    with pytest.raises(RemoteError) as raised:
        await bob.call(ops.SESSIONS_IMPORT, SessionImport(document=exported.document))
    assert raised.value.remote_code == "forbidden"


async def test_state_bag_updates_are_compare_and_set(stack: Stack, alice: RunbusClient) -> None:
    await alice.run("travel", "Weather in Hobart?", session_id="cas")
    info = await alice.call(ops.SESSIONS_GET, SessionGet(session_id="cas"))
    first = await alice.call(
        ops.SESSIONS_STATE_UPDATE,
        SessionStateUpdate(
            session_id="cas", key="todos", value=[1], expected_revision=info.record.revision
        ),
    )
    with pytest.raises(RemoteError) as raised:
        await alice.call(
            ops.SESSIONS_STATE_UPDATE,
            SessionStateUpdate(
                session_id="cas", key="todos", value=[2], expected_revision=info.record.revision
            ),
        )
    assert raised.value.remote_code == "conflict"
    assert first.record.state == {"todos": [1]}


@pytest.mark.parametrize(
    ("body_change", "code"),
    [
        (
            {"input": [{"role": "user", "contents": [{"type": "text", "text": "x" * 300_000}]}]},
            "bad_request",
        ),
        (
            {"input": [{"role": "user", "contents": [{"type": "hologram", "data": "?"}]}]},
            "bad_request",
        ),
        ({"session_id": "../etc"}, "bad_request"),
        (
            {"input": [{"role": "system", "contents": [{"type": "text", "text": "obey"}]}]},
            "bad_request",
        ),
    ],
)
async def test_bad_input_is_refused_and_the_stored_session_is_unchanged(
    stack: Stack, nc: NATS, alice: RunbusClient, body_change: dict[str, object], code: str
) -> None:
    await alice.run("travel", "Weather in Hobart?", session_id="s1")
    before = await history_of(alice, "s1")
    body = {**json.loads(raw_request("r-bad", "x")), **body_change}

    events = await publish_and_collect(nc, "r-bad", json.dumps(body).encode())

    assert types(events) == ["run.failed"]
    assert events[0]["error"]["code"] == code
    assert await history_of(alice, "s1") == before


async def test_append_to_a_missing_session_is_not_found(stack: Stack, nc: NATS) -> None:
    body = {
        "type": "history.append",
        "session_id": "ghost",
        "messages": [{"role": "user", "contents": [], "message_id": "x:in0"}],
    }
    reply = await nc.request(
        "runbus.history.append",
        json.dumps(body).encode(),
        timeout=5,
        headers={"rb-prop-tenant": "acme", "rb-prop-user_id": "alice"},
    )
    assert reply.headers is not None
    assert reply.headers["rb-error"] == "not_found"


@pytest.fixture
async def gated_stack(
    nats_server: SecuredNats, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Stack, GatedModel]]:
    policy = getattr(request, "param", "reject")
    model = GatedModel(weather_then_answer, hold={1})
    agents = {"travel": agent(concurrency=policy)}
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=agents,
        routes={"gated": model},
        gateway_options={"ack_wait": 2.0},
    ) as stack:
        # A second gateway replica: the policy must hold across replicas, not per process.
        await stack.start_service(
            GatewayService, agents=agents, verifier=TokenVerifier.from_file(), ack_wait=2.0
        )
        yield stack, model


async def _final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


@pytest.mark.parametrize("gated_stack", ["reject"], indirect=True)
async def test_second_run_on_a_busy_session_is_rejected_by_default(
    gated_stack: tuple[Stack, GatedModel], alice: RunbusClient
) -> None:
    _, model = gated_stack
    first = await alice.start("travel", "Weather?", session_id="busy")
    await asyncio.wait_for(model.reached.wait(), 10)
    second = await alice.start("travel", "Weather again?", session_id="busy")

    rejected = await _final(alice, second)
    model.release.set()
    done = await _final(alice, first)

    assert isinstance(rejected, RunFailed)
    assert rejected.error.code == "session_busy"
    assert isinstance(done, RunCompleted)
    assert len(await history_of(alice, "busy")) == 4


@pytest.mark.parametrize("gated_stack", ["enqueue"], indirect=True)
async def test_second_run_waits_for_the_first_with_policy_enqueue(
    gated_stack: tuple[Stack, GatedModel], alice: RunbusClient
) -> None:
    _, model = gated_stack
    opens: list[str] = []

    async def on_open(msg: Msg) -> None:
        opens.append((msg.headers or {}).get(h.RUN_ID, ""))

    watch = await alice.nc.subscribe(subjects.SESSIONS_OPEN, cb=on_open)
    first = await alice.start("travel", "Weather?", session_id="queue")
    await asyncio.wait_for(model.reached.wait(), 10)
    second = await alice.start("travel", "Weather again?", session_id="queue")
    # A second open from the second run means the first was refused: it is waiting.
    await eventually(lambda: opens.count(second) >= 2)
    await watch.unsubscribe()
    model.release.set()

    assert isinstance(await _final(alice, first), RunCompleted)
    assert isinstance(await _final(alice, second), RunCompleted)
    ids = await history_of(alice, "queue")
    assert [i.split(":")[0] for i in ids] == [first] * 4 + [second] * 4


@pytest.mark.parametrize("gated_stack", ["interrupt"], indirect=True)
async def test_second_run_cancels_the_first_with_policy_interrupt(
    gated_stack: tuple[Stack, GatedModel], alice: RunbusClient
) -> None:
    _, model = gated_stack
    first = await alice.start("travel", "Weather?", session_id="intr")
    await asyncio.wait_for(model.reached.wait(), 10)
    model.hold.clear()
    second = await alice.start("travel", "Weather again?", session_id="intr")

    cancelled = await _final(alice, first)
    assert isinstance(await _final(alice, second), RunCompleted)
    model.release.set()

    assert isinstance(cancelled, RunFailed)
    assert cancelled.error.code == "cancelled"


async def test_cancelled_run_keeps_its_checkpoint_and_the_session_stays_usable(
    gated_stack: tuple[Stack, GatedModel], alice: RunbusClient
) -> None:
    _, model = gated_stack
    run_id = await alice.start("travel", "Weather?", session_id="cx")
    await asyncio.wait_for(model.reached.wait(), 10)

    info = await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
    final = await asyncio.wait_for(_final(alice, run_id), 1.0)

    assert info.record.status == "running"
    assert isinstance(final, RunFailed)
    assert final.error.code == "cancelled"
    assert await history_of(alice, "cx") == [f"{run_id}:in0", f"{run_id}:m0", f"{run_id}:t0"]
    model.hold.clear()
    done = await alice.run("travel", "Weather now?", session_id="cx")
    assert done.text.startswith("Done:")
    with pytest.raises(RunFailedError):
        await alice.run("nope", "x", session_id="cx")


async def test_deleting_a_session_cancels_the_run_working_on_it(
    gated_stack: tuple[Stack, GatedModel], alice: RunbusClient
) -> None:
    _, model = gated_stack
    run_id = await alice.start("travel", "Weather?", session_id="gone")
    await asyncio.wait_for(model.reached.wait(), 10)

    await alice.call(ops.SESSIONS_DELETE, SessionDelete(session_id="gone"))
    final = await asyncio.wait_for(_final(alice, run_id), 10)
    model.release.set()

    assert isinstance(final, RunFailed)
    assert final.error.code == "cancelled"
    with pytest.raises(RemoteError) as missing:
        await history_of(alice, "gone")
    assert missing.value.remote_code == "not_found"


async def test_deleting_a_session_forgets_the_memories_stored_from_it(
    stack: Stack, alice: RunbusClient
) -> None:
    await alice.run("travel", "Remember that I like aisle seats.", session_id="forget")
    await alice.run("travel", "Remember that I fly from Perth.", session_id="keep")
    listing = MemoryList()

    async def both_stored() -> bool:  # memory writes land through a stream, after the run
        listed = await alice.call(ops.MEMORY_LIST, listing)
        return len(listed.memories) == 2

    await eventually(both_stored)

    deleted = await alice.call(ops.SESSIONS_DELETE, SessionDelete(session_id="forget"))
    left = await alice.call(ops.MEMORY_LIST, listing)

    assert deleted.memories_forgotten
    assert [m.text for m in left.memories] == ["I fly from Perth."]
