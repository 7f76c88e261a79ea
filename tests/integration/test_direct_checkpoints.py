"""A run's checkpoints after the first go straight into the history stream from the gateway:
the same batches as through the history service, stored once on retry and resume, and never
into a session that is no longer the one the run opened."""

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from opentelemetry import trace

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.history_batches import MissingMessageId
from runbus.messages import ChatMessage, HistoryLoad, RunCompleted, RunFailed, TextContent
from runbus.messages.history import (
    BATCH_DECODER,
    HistoryCompaction,
    StoredBatch,
)
from runbus.messages.sessions import (
    SessionDelete,
    SessionExport,
    SessionGet,
    SessionImport,
)
from runbus.tokens import TokenVerifier
from runbus_examples import AGENTS_DIR
from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_gateway import ports as gateway_ports
from runbus_gateway.agents import load_agents
from runbus_gateway.approvals import Approvals
from runbus_gateway.ports import BusPorts
from runbus_gateway.run import checkpoints
from runbus_gateway.service import GatewayService
from runbus_history import store
from runbus_history.core import COMPACTION_DECODER
from runbus_history.service import HistoryService
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, start_stack

ALICE = RunContext(run_id="r-1", session_id="s1", props={"tenant": "acme", "user_id": "alice"})
BOB = RunContext(run_id="r-2", session_id="s1", props={"tenant": "acme", "user_id": "bob"})

# Three tools one after another, then the answer: four checkpoints per run.
SCRIPT = [
    ScriptedReply(tool_calls=[ScriptedCall("get_weather", {"city": "Sydney"})]),
    ScriptedReply(
        tool_calls=[
            ScriptedCall(
                "search_flights",
                {"origin": "Melbourne", "destination": "Sydney", "date": "2026-12-08"},
            )
        ]
    ),
    ScriptedReply(tool_calls=[ScriptedCall("create_booking", {"flight_id": "QF412-20261208"})]),
    ScriptedReply(text="Booked: {last_result}"),
]
TRAVEL = load_agents(AGENTS_DIR)["travel"]
PLANNER = msgspec.structs.replace(TRAVEL, name="planner", model="scripted/planner")


@pytest.fixture(autouse=True)
def appends_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs here append each step's checkpoint to history, as a run holding back more than
    `APPEND_BYTES` does: the direct path is what these tests are about (a step's checkpoint
    otherwise rides on its first call event: tests/integration/test_durable_runs.py)."""
    monkeypatch.setattr(checkpoints, "APPEND_BYTES", -1)


def said(message_id: str, text: str = "hi", role: str = "user") -> ChatMessage:
    return ChatMessage(
        role=role,  # type: ignore[arg-type]
        contents=[TextContent(text=text)],
        message_id=message_id,
    )


def appends_served(history: HistoryService) -> int:
    assert history._micro is not None
    return sum(e.num_requests for e in history._micro.stats().endpoints if e.name == "append")


async def stored_batches(nc: NATS, tenant: str, session_id: str) -> list[StoredBatch]:
    subject = subjects.history_log(tenant, session_id)
    return [BATCH_DECODER.decode(data) async for _, data in store.read_subject(nc, subject, 5.0)]


def stored_ids(batches: list[StoredBatch]) -> list[str]:
    return [m.message_id for b in batches for m in b.messages]


@pytest.fixture
def ports(nc: NATS) -> BusPorts:
    return BusPorts(Bus(nc, trace.get_tracer("test")), cast(Approvals, None))


async def load(ports: BusPorts, ctx: RunContext) -> list[str]:
    loaded = await ports.bus.call(ops.HISTORY_LOAD, HistoryLoad(session_id="s1"), ctx=ctx)
    return [m.message_id for m in loaded.messages]


async def test_checkpoints_skip_the_history_service_and_load_as_before(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    opened = await ports.open_session(ALICE, "reject")
    assert opened.history_end == 0
    incarnation = opened.record.incarnation

    first = await ports.append_history(
        ALICE, [said("r-1:in0"), said("r-1:m0")], history_end=0, incarnation=incarnation
    )
    assert first
    second = await ports.append_history(
        ALICE, [said("r-1:t0"), said("r-1:m1")], history_end=first, incarnation=incarnation
    )
    assert appends_served(history) == 0
    assert second is not None
    assert second > first
    await ports.append_history(
        ALICE, [said("r-1:t1"), said("r-1:m2")], release=True, history_length=6,
        history_end=second, incarnation=incarnation,
    )  # fmt: skip

    assert appends_served(history) == 1
    assert await load(ports, ALICE) == [f"r-1:{p}" for p in ("in0", "m0", "t0", "m1", "t1", "m2")]
    record = await ports.get_session(ALICE)
    assert (record.active_run, record.history_length) == (None, 6)
    # Opened again, the session says where its history ends: the next run starts direct.
    again = await ports.open_session(msgspec.structs.replace(ALICE, run_id="r-3"), "reject")
    assert again.history_end is not None
    assert again.history_end > second


async def test_a_retried_direct_checkpoint_is_stored_once(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    incarnation = (await ports.open_session(ALICE, "reject")).record.incarnation
    end = await ports.append_history(
        ALICE, [said("r-1:in0")], history_end=0, incarnation=incarnation
    )
    batch = [said("r-1:m0"), said("r-1:t0")]
    after = await ports.append_history(ALICE, batch, history_end=end, incarnation=incarnation)

    # The gateway died before it heard the ack; the resumed run stores the same batch again.
    for seen in (end, after):
        await ports.append_history(ALICE, batch, history_end=seen, incarnation=incarnation)

    assert stored_ids(await stored_batches(nc, "acme", "s1")) == ["r-1:in0", "r-1:m0", "r-1:t0"]


async def test_a_direct_checkpoint_keeps_out_what_was_loaded_and_refuses_a_message_without_id(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    incarnation = (await ports.open_session(ALICE, "reject")).record.incarnation
    end = await ports.append_history(
        ALICE, [said("r-1:in0")], history_end=0, incarnation=incarnation
    )
    loaded = msgspec.structs.replace(said("r-0:m0"), source="chat_history")

    await ports.append_history(
        ALICE, [loaded, said("r-1:m0")], history_end=end, incarnation=incarnation
    )
    with pytest.raises(MissingMessageId):
        await ports.append_history(
            ALICE, [said("r-1:m1"), said("")], history_end=end, incarnation=incarnation
        )

    assert stored_ids(await stored_batches(nc, "acme", "s1")) == ["r-1:in0", "r-1:m0"]


@pytest.mark.parametrize("stored_before", [True, False])
async def test_no_checkpoint_lands_in_a_session_deleted_and_taken_by_someone_else(
    history: HistoryService, ports: BusPorts, nc: NATS, stored_before: bool
) -> None:
    opened = await ports.open_session(ALICE, "reject")
    end = opened.history_end
    if stored_before:
        end = await ports.append_history(ALICE, [said("r-1:in0")], history_end=end)
    await ports.bus.call(ops.SESSIONS_DELETE, SessionDelete(session_id="s1"), ctx=ALICE)
    taken = await ports.open_session(BOB, "reject")
    assert taken.created

    with pytest.raises(RemoteError) as refused:
        await ports.append_history(ALICE, [said("r-1:m0"), said("r-1:t0")], history_end=end)

    assert refused.value.remote_code == "not_found"
    assert await load(ports, BOB) == []
    assert await stored_batches(nc, "acme", "s1") == []


@pytest.mark.parametrize("stored_before", [True, False])
async def test_no_checkpoint_of_a_deleted_session_is_read_by_the_one_made_again_under_its_id(
    history: HistoryService, ports: BusPorts, nc: NATS, stored_before: bool
) -> None:
    """ "Clear the conversation, start again": alice deletes her session while a run of hers
    still works on it and opens a new one of the same id at once. The old run's late
    checkpoint names the session it opened: refused where the delete moved the history's
    end; on a session with nothing stored (no end to move) stored for the old incarnation,
    which the new one never reads. The release is refused either way."""
    opened = await ports.open_session(ALICE, "reject")
    old = opened.record.incarnation
    assert old
    end = opened.history_end
    if stored_before:
        end = await ports.append_history(ALICE, [said("r-1:in0")], history_end=end, incarnation=old)
    await ports.bus.call(ops.SESSIONS_DELETE, SessionDelete(session_id="s1"), ctx=ALICE)
    again = msgspec.structs.replace(ALICE, run_id="r-5")
    made = await ports.open_session(again, "reject")
    assert made.created
    assert made.record.incarnation not in ("", old)

    late = [said("r-1:m0", "the old conversation"), said("r-1:t0")]
    if stored_before:
        with pytest.raises(RemoteError) as refused:
            await ports.append_history(ALICE, late, history_end=end, incarnation=old)
        assert refused.value.remote_code == "not_found"
    else:
        assert await ports.append_history(ALICE, late, history_end=end, incarnation=old)
    with pytest.raises(RemoteError) as refused:
        await ports.append_history(ALICE, late, release=True, history_end=end, incarnation=old)
    assert refused.value.remote_code == "not_found"

    assert await load(ports, again) == []
    reopened = await ports.open_session(again, "reject")  # what its resume would find
    assert reopened.messages == []
    exported = await ports.bus.call(ops.SESSIONS_EXPORT, SessionExport(session_id="s1"), ctx=again)
    assert exported.document.messages == []
    assert {b.incarnation for b in await stored_batches(nc, "acme", "s1")} <= {old}
    record = await ports.get_session(again)
    assert record.active_run == "r-5"


async def stored_compactions(nc: NATS, tenant: str, session_id: str) -> list[HistoryCompaction]:
    subject = subjects.history_compactions(tenant, session_id)
    return [
        COMPACTION_DECODER.decode(data) async for _, data in store.read_subject(nc, subject, 5.0)
    ]


def window(kept: list[str], excluded: list[str]) -> HistoryCompaction:
    """A persisted compaction that keeps `kept` and replaces `excluded`."""
    return HistoryCompaction(messages=[said(i) for i in kept], excluded_message_ids=excluded)


async def test_a_persisted_compaction_goes_straight_into_the_history_stream_with_its_checkpoint(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    opened = await ports.open_session(ALICE, "reject")
    incarnation = opened.record.incarnation
    end = await ports.append_history(
        ALICE, [said("r-1:in0"), said("r-1:m0"), said("r-1:t0")], history_end=0,
        incarnation=incarnation,
    )  # fmt: skip
    assert end
    compaction = window(["r-1:t0"], ["r-1:in0", "r-1:m0"])

    after = await ports.append_history(
        ALICE, [said("r-1:m1")], compaction=compaction, history_end=end, incarnation=incarnation
    )
    # A retry of the same append (the gateway died before the acks) stores neither again.
    await ports.append_history(
        ALICE, [said("r-1:m1")], compaction=compaction, history_end=end, incarnation=incarnation
    )

    assert appends_served(history) == 1  # the retry's, whose checkpoint was stored already
    assert after is not None
    assert after > end
    assert await load(ports, ALICE) == ["r-1:t0", "r-1:m1"]
    stored = await stored_compactions(nc, "acme", "s1")
    assert [(c.incarnation, [m.message_id for m in c.messages]) for c in stored] == [
        (incarnation, ["r-1:t0"])
    ]


async def test_no_persisted_compaction_lands_in_a_session_deleted_and_made_again(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    opened = await ports.open_session(ALICE, "reject")
    old = opened.record.incarnation
    end = await ports.append_history(
        ALICE, [said("r-1:in0"), said("r-1:m0")], history_end=0, incarnation=old
    )
    assert end
    await ports.bus.call(ops.SESSIONS_DELETE, SessionDelete(session_id="s1"), ctx=ALICE)
    again = msgspec.structs.replace(ALICE, run_id="r-5")
    assert (await ports.open_session(again, "reject")).created

    with pytest.raises(RemoteError) as refused:
        await ports.append_history(
            ALICE, [said("r-1:t0")], compaction=window(["r-1:m0"], ["r-1:in0"]),
            history_end=end, incarnation=old,
        )  # fmt: skip

    assert refused.value.remote_code == "not_found"
    assert await stored_compactions(nc, "acme", "s1") == []
    assert await stored_batches(nc, "acme", "s1") == []


async def test_a_new_sessions_first_checkpoint_skips_the_history_service_too(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    opened = await ports.open_session(ALICE, "reject")
    assert opened.history_end == 0

    end = await ports.append_history(
        ALICE,
        [said("r-1:in0"), said("r-1:m0")],
        history_end=0,
        incarnation=opened.record.incarnation,
    )

    assert appends_served(history) == 0
    assert end
    assert await load(ports, ALICE) == ["r-1:in0", "r-1:m0"]


async def test_a_run_that_does_not_know_its_sessions_incarnation_appends_through_history(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    """A run that names no incarnation (its session was opened by a gateway from before they
    were kept) could only store unstamped batches directly, which no session with an
    incarnation reads: every append goes through the service, which stamps the record's."""
    opened = await ports.open_session(ALICE, "reject")
    end = await ports.append_history(ALICE, [said("r-1:in0")], history_end=0)
    await ports.append_history(ALICE, [said("r-1:m0")], history_end=end)

    assert appends_served(history) == 2
    assert await load(ports, ALICE) == ["r-1:in0", "r-1:m0"]
    batches = await stored_batches(nc, "acme", "s1")
    assert {b.incarnation for b in batches} == {opened.record.incarnation}


async def test_every_batch_a_run_stores_names_the_session_incarnation_it_opened(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    opened = await ports.open_session(ALICE, "reject")
    incarnation = opened.record.incarnation
    end = await ports.append_history(
        ALICE, [said("r-1:in0")], history_end=0, incarnation=incarnation
    )
    await ports.append_history(ALICE, [said("r-1:m0")], history_end=end, incarnation=incarnation)
    await ports.append_history(
        ALICE, [said("r-1:m1")], release=True, history_end=end, incarnation=incarnation
    )

    batches = await stored_batches(nc, "acme", "s1")
    assert stored_ids(batches) == ["r-1:in0", "r-1:m0", "r-1:m1"]
    assert {b.incarnation for b in batches} == {incarnation}


async def test_a_checkpoint_after_another_runs_write_goes_through_history_and_is_kept(
    history: HistoryService, ports: BusPorts, nc: NATS
) -> None:
    # Policy `interrupt`: the displaced run may still store its step after the new one did.
    incarnation = (await ports.open_session(ALICE, "reject")).record.incarnation
    end = await ports.append_history(
        ALICE, [said("r-1:in0")], history_end=0, incarnation=incarnation
    )
    newer = msgspec.structs.replace(ALICE, run_id="r-9")
    await ports.open_session(newer, "interrupt")
    await ports.append_history(newer, [said("r-9:in0")], history_end=end, incarnation=incarnation)
    served = appends_served(history)
    assert served == 0

    await ports.append_history(ALICE, [said("r-1:m0")], history_end=end, incarnation=incarnation)

    assert appends_served(history) == served + 1
    assert await load(ports, ALICE) == ["r-1:in0", "r-9:in0", "r-1:m0"]


async def test_direct_checkpoints_count_against_the_sessions_append_limit(
    nc: NATS, ports: BusPorts
) -> None:
    limited = HistoryService(nc, max_appends_per_session=2)
    await limited.start()
    try:
        incarnation = (await ports.open_session(ALICE, "reject")).record.incarnation
        end = await ports.append_history(
            ALICE, [said("r-1:in0")], history_end=0, incarnation=incarnation
        )
        for step in range(3):
            end = await ports.append_history(
                ALICE, [said(f"r-1:m{step}")], history_end=end, incarnation=incarnation
            )
        assert appends_served(limited) == 0
        assert await load(ports, ALICE) == ["r-1:m1", "r-1:m2"]
    finally:
        await limited.stop()


# -- whole runs ---------------------------------------------------------------------------


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


def shown(messages: list[ChatMessage], run_id: str) -> list[tuple[str, str, str, bytes]]:
    """What a transcript shows of each message, what differs by run (its id, the booking's
    confirmation made from it) made generic so two runs compare."""
    return [
        (
            m.role,
            m.message_id.replace(run_id, "{run}"),
            m.source,
            re.sub(rb"RB-[0-9A-F]{6}", b"RB-{ref}", msgspec.json.encode(m.contents)),
        )
        for m in messages
    ]


async def session_as_seen(client: RunbusClient, session_id: str, run_id: str) -> dict[str, Any]:
    loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
    exported = await client.call(ops.SESSIONS_EXPORT, SessionExport(session_id=session_id))
    record = await client.call(ops.SESSIONS_GET, SessionGet(session_id=session_id))
    return {
        "load": shown(loaded.messages, run_id),
        "export": shown(exported.document.messages, run_id),
        "history_length": record.record.history_length,
    }


async def test_a_runs_history_is_the_same_whichever_way_its_checkpoints_went(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents={"planner": PLANNER},
        scripts={"planner": SCRIPT},
    ) as stack:
        history = stack.services["history"]
        assert isinstance(history, HistoryService)
        direct = await alice.run("planner", "Book me a flight.", session_id="direct")
        direct_appends = appends_served(history)

        async def through_history(*args: object) -> None:
            return None

        with monkeypatch.context() as patched:
            patched.setattr(gateway_ports, "store_checkpoint", through_history)
            served = await alice.run("planner", "Book me a flight.", session_id="served")
        served_appends = appends_served(history) - direct_appends

        seen = await session_as_seen(alice, "direct", direct.run_id)
        expected = await session_as_seen(alice, "served", served.run_id)
        exported = await alice.call(ops.SESSIONS_EXPORT, SessionExport(session_id="direct"))
        await alice.call(ops.SESSIONS_DELETE, SessionDelete(session_id="direct"))
        await alice.call(ops.SESSIONS_IMPORT, SessionImport(document=exported.document))
        imported = await session_as_seen(alice, "direct", direct.run_id)
        batches = await stored_batches(history.nc, "acme", "direct")

    assert (direct_appends, served_appends) == (1, 4)  # only the releasing one
    assert seen == expected
    assert len(seen["load"]) == 8
    assert imported == seen
    assert len(stored_ids(batches)) == len(set(stored_ids(batches))) == 8


@pytest.mark.slow
async def test_a_run_resumed_after_its_gateway_died_between_direct_checkpoints_stores_each_once(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer)
    agents = {"travel": msgspec.structs.replace(TRAVEL, model="gated")}
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=agents,
        routes={"gated": model},
        gateway_options={"ack_wait": 1.5},
    ) as stack:
        history = stack.services["history"]
        assert isinstance(history, HistoryService)
        earlier = await alice.run("travel", "Weather?", session_id="crash")
        served = appends_served(history)
        model.hold.add(1)
        run_id = await alice.start("travel", "Weather again?", session_id="crash")
        await asyncio.wait_for(model.reached.wait(), 10)  # step 0 and its call are stored
        assert appends_served(history) == served  # ... straight into the stream
        doomed = stack.services["gateway"]
        await stack.start_service(
            GatewayService, agents=agents, verifier=TokenVerifier.from_file(), ack_wait=1.5
        )
        model.hold.clear()
        await doomed.nc.close()  # the replica vanishes mid-run: no ack, no cleanup
        model.release.set()
        finals = [
            i.event
            async for i in alice.follow(run_id, timeout=20)
            if isinstance(i.event, RunCompleted | RunFailed)
        ]
        loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="crash"))
        batches = await stored_batches(history.nc, "acme", "crash")

    assert [type(f) for f in finals] == [RunCompleted]
    parts = ("in0", "m0", "t0", "m1")
    expected = [f"{earlier.run_id}:{p}" for p in parts] + [f"{run_id}:{p}" for p in parts]
    assert [m.message_id for m in loaded.messages] == expected
    assert stored_ids(batches) == expected  # no batch, no message stored twice
