"""A run that failed for good leaves nothing the next run's prompt loads: its messages stay
stored (audit, export) behind a marker that every later load honours."""

from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from opentelemetry import trace

from runbus import ops
from runbus.bus import Bus
from runbus.client import RunbusClient, RunFailedError
from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages import ChatMessage, HistoryAppend, HistoryLoad, ModelRequest, TextContent
from runbus.messages.sessions import SessionDelete, SessionExport, SessionImport, SessionOpen
from runbus_gateway.agents import load_agents
from runbus_history.service import HistoryService
from runbus_model_router.errors import ProviderRejected
from tests.models import GatedModel, Reply, text
from tests.stack import SecuredNats, Stack, start_stack

PLAIN = """
name = "plain"
instructions = "You answer."
model = "gated"
"""


def ctx(run_id: str) -> RunContext:
    return RunContext(run_id=run_id, session_id="s1", props={"tenant": "acme", "user_id": "alice"})


def said(run_id: str, part: str, role: str = "user") -> ChatMessage:
    return ChatMessage(
        role=role,  # type: ignore[arg-type]
        contents=[TextContent(text=f"{run_id} {part}")],
        message_id=f"{run_id}:{part}",
    )


async def run_on(
    bus: Bus, run_id: str, *, abandon: bool = False, closes: bool = False
) -> list[str]:
    """Open the session as `run_id`, store its input and reply, release it (marked failed
    for good with `abandon`, finished with `closes`); the ids the run loaded when it
    opened."""
    opened = await bus.call(ops.SESSIONS_OPEN, SessionOpen(session_id="s1"), ctx=ctx(run_id))
    messages = [said(run_id, "in"), said(run_id, "a1", "assistant")]
    await bus.call(
        ops.HISTORY_APPEND,
        HistoryAppend(
            session_id="s1",
            messages=messages,
            release=True,
            abandon=abandon,
            closes=closes,
            incarnation=opened.record.incarnation,
        ),
        ctx=ctx(run_id),
    )
    return [m.message_id for m in opened.messages]


async def test_a_run_that_failed_for_good_is_left_out_of_later_loads_but_kept_for_audit(
    stack: Stack, nc: NATS
) -> None:
    bus = Bus(nc, trace.get_tracer("test"))
    await run_on(bus, "r-1")
    await run_on(bus, "r-2", abandon=True)
    seen_by_r3 = await run_on(bus, "r-3")
    audit = await bus.call(
        ops.HISTORY_LOAD, HistoryLoad(session_id="s1", originals=True), ctx=ctx("x")
    )
    exported = await bus.call(ops.SESSIONS_EXPORT, SessionExport(session_id="s1"), ctx=ctx("x"))
    await bus.call(ops.SESSIONS_DELETE, SessionDelete(session_id="s1"), ctx=ctx("x"))
    await bus.call(ops.SESSIONS_IMPORT, SessionImport(document=exported.document), ctx=ctx("x"))
    seen_by_r4 = await run_on(bus, "r-4")
    again = await bus.call(ops.SESSIONS_EXPORT, SessionExport(session_id="s1"), ctx=ctx("x"))

    assert seen_by_r3 == ["r-1:in", "r-1:a1"]
    assert [m.message_id for m in audit.messages] == [
        f"{run}:{part}" for run in ("r-1", "r-2", "r-3") for part in ("in", "a1")
    ]
    assert exported.document.abandoned_runs == ["r-2"]
    assert seen_by_r4 == ["r-1:in", "r-1:a1", "r-3:in", "r-3:a1"]
    assert again.document.abandoned_runs == ["r-2"]
    assert msgspec.json.encode(again.document.messages[:6]) == msgspec.json.encode(
        exported.document.messages
    )


def fails_once_on(word: str) -> Reply:
    """Refuses (HTTP 400, no retry fixes it) any request whose last question has `word`."""

    def reply(request: ModelRequest, step: int) -> ChatMessage:
        asked = [m.text for m in request.messages if m.role == "user"][-1]
        if word in asked:
            raise ProviderRejected("HTTP 400: the provider refused the request", status=400)
        return text(f"answer to {asked}")

    return reply


async def test_the_next_prompt_carries_nothing_of_a_run_that_failed_for_good(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "plain.toml").write_text(PLAIN)
    model = GatedModel(fails_once_on("poison"))
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=load_agents(tmp_path / "agents"),
        routes={"gated": model},
    ):
        nc = await nats.connect(nats_server.url)
        client = RunbusClient(nc, token="dev-alice")
        await client.run("plain", "first question", session_id="s")
        with pytest.raises(RunFailedError) as failed:
            await client.run("plain", "poison question", session_id="s")
        await client.run("plain", "third question", session_id="s")
        audit = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="s", originals=True))
        await nc.drain()

    assert failed.value.known_code == "model_error"
    # One call for the failed run: a refusal no retry fixes is not retried.
    assert sum("poison" in str(r.messages[-1].text) for r in model.requests) == 1
    last = [m.text for m in model.requests[-1].messages if m.role == "user"]
    assert last == ["first question", "third question"]
    assert "poison question" in [m.text for m in audit.messages]


async def test_a_late_attempt_failing_a_run_that_closed_its_history_hides_none_of_it(
    stack: Stack, nc: NATS
) -> None:
    # Two attempts of r-2 alive at once (a partition): one finished the run and closed its
    # history; the other, cut off, then fails it for good and leaves an abandon marker.
    bus = Bus(nc, trace.get_tracer("test"))
    await run_on(bus, "r-1")
    await run_on(bus, "r-2", closes=True)
    await bus.call(
        ops.HISTORY_APPEND,
        HistoryAppend(session_id="s1", messages=[], release=True, abandon=True),
        ctx=ctx("r-2"),
    )
    seen_by_r3 = await run_on(bus, "r-3")
    exported = await bus.call(ops.SESSIONS_EXPORT, SessionExport(session_id="s1"), ctx=ctx("x"))

    assert seen_by_r3 == ["r-1:in", "r-1:a1", "r-2:in", "r-2:a1"]
    assert exported.document.abandoned_runs == []


async def test_a_run_closed_by_two_attempts_keeps_the_first_attempts_transcript_once(
    stack: Stack, nc: NATS
) -> None:
    # Two attempts of r-2 both finished (the later one started just after the earlier one's
    # last check): the events stream kept the first final event, history the first transcript.
    bus = Bus(nc, trace.get_tracer("test"))
    await run_on(bus, "r-1")
    opened = await bus.call(ops.SESSIONS_OPEN, SessionOpen(session_id="s1"), ctx=ctx("r-2"))
    closings = [
        [said("r-2", "in"), said("r-2", "a1", "assistant")],
        [said("r-2", "in"), said("r-2", "a1-again", "assistant")],
    ]
    appended = [
        await bus.call(
            ops.HISTORY_APPEND,
            HistoryAppend(
                session_id="s1",
                messages=messages,
                release=True,
                closes=True,
                incarnation=opened.record.incarnation,
            ),
            ctx=ctx("r-2"),
        )
        for messages in closings
    ]
    seen_by_r3 = await run_on(bus, "r-3")

    assert [a.stored for a in appended] == [2, 0]
    assert seen_by_r3 == ["r-1:in", "r-1:a1", "r-2:in", "r-2:a1"]


async def test_a_session_whose_record_a_lagging_replica_cannot_read_yet_is_unavailable_not_gone(
    stack: Stack, nc: NATS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a cluster: the create is refused because the record exists, and the read that
    # follows is answered by a replica that does not have it yet.
    history = stack.services["history"]
    assert isinstance(history, HistoryService)

    async def lost_the_race(record: object) -> None:
        return None

    async def not_there_yet(tenant: str, session_id: str) -> None:
        return None

    monkeypatch.setattr(history.records, "create", lost_the_race)
    monkeypatch.setattr(history.records, "get", not_there_yet)
    bus = Bus(nc, trace.get_tracer("test"))
    with pytest.raises(RemoteError) as refused:
        await bus.call(ops.SESSIONS_OPEN, SessionOpen(session_id="s9"), ctx=ctx("r-9"))

    assert refused.value.remote_code == "unavailable"
