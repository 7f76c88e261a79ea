"""`runbus chat` against the whole stack: each line is a run streamed as it arrives, slash
commands read the session without a model call, and a paused run is decided in place."""

import argparse
import io
import re
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus import ops, todos
from runbus.client import RunbusClient
from runbus.commands.chat import ChatConsole, handle_todos
from runbus.messages import HistoryLoad, ModelRequest
from runbus.messages.sessions import SessionGet, SessionStateUpdate
from runbus.settings import Settings
from runbus.todos import TodoItem, TodoState
from runbus_examples import AGENTS_DIR
from runbus_examples.travel import ledger
from runbus_gateway.agents import load_agents
from runbus_gateway.harness import modes as harness_modes
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, Stack, start_stack


async def lines(*typed: str) -> AsyncIterator[str]:
    for line in typed:
        yield line + "\n"


@pytest.fixture
async def client(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


def console(client: RunbusClient, session_id: str = "chat-1") -> tuple[ChatConsole, io.StringIO]:
    out = io.StringIO()
    return (
        ChatConsole(
            client,
            agent="travel",
            session_id=session_id,
            out=out,
            jaeger_url="http://localhost:16686/",
            timeout=20,
        ),
        out,
    )


async def test_a_line_is_a_streamed_run_and_slash_commands_read_the_session(
    stack: Stack, client: RunbusClient, spans: InMemorySpanExporter
) -> None:
    chat, out = console(client)

    await chat.run(
        lines(
            "/trace",
            "/todos",
            "/mode execute",
            "Weather in Sydney?",
            "/history",
            "/mode",
            "/trace",
            "/nonsense",
            "/quit",
            "Never sent",
        )
    )

    shown = out.getvalue()
    before_run, after_run = shown.split("  → get_weather", 1)
    assert "no run yet" in before_run
    assert "### Current todo list\n- none yet" in before_run
    assert "no session yet: send a message first" in before_run
    assert '{"city": "Sydney"}' in after_run.splitlines()[0]
    assert re.search(r"\n  assistant: .*Sydney", after_run)
    assert "[user     ] Weather in Sydney?" in after_run
    assert "[tool     ] ←" in after_run
    assert "mode: plan (the agent's default)" in after_run
    assert "unknown command /nonsense; /help lists them" in after_run
    assert "Never sent" not in shown
    loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="chat-1"))
    assert [m.text for m in loaded.messages if m.role == "user"] == ["Weather in Sydney?"]
    # /trace names the trace the gateway recorded the run under, with a Jaeger link.
    found = re.search(r"run (r-\w+): trace ([0-9a-f]{32})\n  (\S+)", after_run)
    assert found is not None
    run_id, trace_id, link = found.groups()
    assert link == f"http://localhost:16686/trace/{trace_id}"
    run_spans = [
        s
        for s in spans.get_finished_spans()
        if s.name == "process runbus.runs.{agent}"
        and s.attributes is not None
        and s.attributes.get("runbus.run_id") == run_id
    ]
    assert run_spans
    assert {f"{s.context.trace_id:032x}" for s in run_spans} == {trace_id}


async def test_mode_switches_from_the_console_reach_the_harness_as_a_one_off_notice(
    stack: Stack, client: RunbusClient
) -> None:
    chat, out = console(client, "chat-mode")
    await chat.run(lines("Weather in Perth?", "/mode execute", "/mode execute", "/mode yolo"))

    info = await client.call(ops.SESSIONS_GET, SessionGet(session_id="chat-mode"))
    stored = harness_modes.ModeState  # the gateway's reading of what the console wrote
    mode = msgspec.convert(info.record.state["mode"], stored)
    notice = harness_modes.notification(mode)

    assert "mode: execute (the agent is told on its next run)" in out.getvalue()
    assert "mode: execute (unchanged)" in out.getvalue()
    assert "usage: /mode [plan|execute]" in out.getvalue()
    assert mode == stored(mode="execute", changed_from="plan")
    assert notice is not None
    assert "from 'plan' to 'execute'" in notice.text


async def test_todos_show_what_the_gateway_stored_in_any_session_without_a_model_call(
    stack: Stack,
    client: RunbusClient,
    capsys: pytest.CaptureFixture[str],
    nats_server: SecuredNats,
) -> None:
    chat, out = console(client, "chat-todos")
    await chat.run(lines("Weather in Hobart?", "/session new"))
    stored = TodoState(
        items=[
            TodoItem(id=1, title="Check the weather", done=True),
            TodoItem(id=3, title="Book a flight", description="economy, morning"),
        ],
        next_id=4,
    )
    await client.call(
        ops.SESSIONS_STATE_UPDATE,
        SessionStateUpdate(session_id="chat-todos", key="todos", value=todos.dump(stored)),
    )

    await chat.run(lines("/session", "/todos", "/session switch chat-todos", "/todos"))
    await handle_todos(
        Settings(nats_url=nats_server.url),
        argparse.Namespace(session="chat-todos", json=False),
    )

    shown = out.getvalue()
    assert re.search(r"session: s-[0-9a-f]{12}\n### Current todo list\n- none yet\n", shown)
    assert shown.endswith(
        "session: chat-todos\n"
        "### Current todo list\n"
        "- 1 [done] Check the weather\n"
        "- 3 [open] Book a flight: economy, morning\n"
    )
    assert (
        "\n### Current todo list\n- 1 [done] Check the weather\n"
        "- 3 [open] Book a flight: economy, morning\n"
    ) in capsys.readouterr().out


async def test_memory_is_listed_or_reported_unavailable(stack: Stack, client: RunbusClient) -> None:
    chat, out = console(client, "chat-memory")

    await chat.run(lines("/memory"))

    last = out.getvalue().splitlines()[-1]
    assert last == "not available: this gateway does not offer memory.list" or (
        last.startswith("- ") or last == "(nothing remembered yet)"
    )


def book_business(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    if step == 0:
        return call("create_booking", "c-book", flight_id="QF412-20261208", cabin="business")
    result = [r for m in request.messages for r in m.function_results][-1]
    return text(f"Outcome: {result.error or result.result}")


async def test_a_run_waiting_for_approval_is_decided_from_the_console(
    nats_server: SecuredNats, tmp_path: Path, client: RunbusClient
) -> None:
    agents = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=agents,
        routes={"gated": GatedModel(book_business)},
    ):
        chat, out = console(client, "chat-approve")
        await chat.run(lines("Book QF412 in business", "And a hotel?", "/approve fine"))
        await chat.run(lines("/approve"))

    shown = out.getvalue()
    asked, decided = shown.split("create_booking: approved", 1)
    assert "  ? create_booking needs approval" in asked
    assert "    /approve or /deny [note] to decide here" in asked
    assert "the last run waits for your decision: /approve or /deny first" in asked
    assert "  assistant: Outcome: " in decided
    assert "nothing waits for a decision" in decided
    assert chat.last_run_id is not None
    assert ledger.count(chat.last_run_id) == 1
