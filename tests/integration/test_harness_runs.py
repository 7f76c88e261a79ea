"""The agent harness in real runs: guardrails refuse before any model call, the todo list
lives in the session's state bag, loop mode keeps going while work remains, and a program
agent serves the same run contract."""

import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, ModelRequest
from runbus.messages.sessions import SessionGet
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import AgentSpec, load_agents
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

BASE = """
name = "{name}"
instructions = "You are a careful assistant."
model = "gated"
tools = ["get_weather"]
"""


def agent(tmp_path: Path, name: str, harness: str) -> dict[str, AgentSpec]:
    folder = tmp_path / f"agents-{name}"
    folder.mkdir()
    (folder / f"{name}.toml").write_text(BASE.format(name=name) + harness)
    return load_agents(folder)


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


async def test_a_blocked_term_is_refused_without_any_model_call(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, spans: InMemorySpanExporter
) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    agents = agent(
        tmp_path,
        "guarded",
        """
[harness]
guardrails = [{name = "blocked_terms", terms = ["wire the money"]}]
""",
    )
    model = GatedModel(lambda request, step: text("never"))
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=agents,
        routes={"gated": model},
        processor=SimpleSpanProcessor(spans),
    ):
        done = await alice.run("guarded", "Please WIRE the money now", session_id="g")

    assert model.requests == []
    names = [s.name for s in spans.get_finished_spans()]
    assert "process runbus.model.complete" not in names
    assert "process runbus.sessions.open" not in names  # nothing stored, nothing loaded
    assert done.text
    assert "never" not in done.text


TODOS = """
[harness.todos]
enabled = true
"""


async def test_todos_live_in_the_state_bag_and_the_model_sees_the_current_list(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    def plan(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        if step == 0:
            return call(
                "todos_add", "c-add", todos=[{"title": " Book flight "}, {"title": "Book hotel"}]
            )
        if step == 1:
            return call("todos_complete", "c-done", items=[{"id": 1, "reason": "booked QF1"}])
        return text("One left.")

    model = GatedModel(plan)
    agents = agent(tmp_path, "planner", TODOS)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=agents, routes={"gated": model}
    ):
        await alice.run("planner", "Plan my trip", session_id="p")
        info = await alice.call(ops.SESSIONS_GET, SessionGet(session_id="p"))
        loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="p"))

    seen = [
        m.text
        for m in model.requests[1].messages
        if m.text.startswith("### Current todo list") and m.source == "context_provider"
    ]
    assert seen == ["### Current todo list\n- 1 [open] Book flight\n- 2 [open] Book hotel"]
    items = info.record.state["todos"]["items"]
    assert [(i["id"], i["title"], i["done"]) for i in items] == [
        (1, "Book flight", True),
        (2, "Book hotel", False),
    ]
    assert "booked QF1" not in json.dumps(info.record.state)  # the reason is not stored
    assert not any(m.text.startswith("### Current todo list") for m in loaded.messages)
    assert "todos_add" in [t.name for t in model.requests[0].tools]


async def test_loop_mode_continues_while_todos_are_open_and_stops_at_the_bound(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    def lazy(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        if not any(m.function_calls for m in request.messages):
            return call("todos_add", "c-add", todos=[{"title": "Never done"}])
        return text("Still working.")

    model = GatedModel(lazy)
    agents = agent(
        tmp_path,
        "looper",
        TODOS
        + """
[harness.loop]
enabled = true
max_loop_iterations = 3
evaluators = [{name = "todos_open"}]
""",
    )
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=agents, routes={"gated": model}
    ):
        done = await alice.run("looper", "Work through the list", session_id="l")

    feedback = [m for m in done.response if m.role == "user"]
    assert len(feedback) == 2  # passes 2 and 3 were asked for; the bound stops a 4th
    assert "Never done" in feedback[0].text
    assert done.text == "Still working."


async def test_a_program_agent_serves_the_same_run_contract(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    folder = tmp_path / "agents"
    folder.mkdir()
    (folder / "refunds.toml").write_text("""
name = "refunds"
[harness]
kind = "program"
program = "runbus_examples.refund:RefundPolicyAgent"
""")
    agents = {**load_agents(folder), **load_agents(AGENTS_DIR)}
    async with start_stack(nats_server.url, data_dir=tmp_path, agents=agents):
        first = await alice.run("refunds", "I want a refund for my shoes", session_id="r")
        loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="r"))

    assert first.text
    assert [m.role for m in loaded.messages] == ["user", "assistant"]
    assert loaded.messages[1].text == first.text


async def test_the_todo_list_survives_compaction_of_its_turn_and_a_restart(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    def plan(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        users = [m for m in request.messages if m.role == "user" and m.source != "context_provider"]
        if "Plan" in users[-1].text and step == 0:
            return call("todos_add", "c-add", todos=[{"title": "Book hotel"}])
        return text("Noted.")

    model = GatedModel(plan)
    agents = agent(
        tmp_path,
        "keeper",
        TODOS
        + """
[compaction]
strategy = "sliding_window"
trigger = {condition = "turns_exceed", turns = 1}
minimum_preserved = 1
""",
    )
    async with start_stack(
        nats_server.url, data_dir=tmp_path / "a", agents=agents, routes={"gated": model}
    ):
        await alice.run("keeper", "Plan my trip", session_id="k")
        await alice.run("keeper", "Something else", session_id="k")
    async with start_stack(
        nats_server.url, data_dir=tmp_path / "b", agents=agents, routes={"gated": model}
    ):
        await alice.run("keeper", "And now?", session_id="k")

    last = model.requests[-1].messages
    assert not any("Plan my trip" in m.text for m in last)  # its turn was compacted away
    listed = [m.text for m in last if m.text.startswith("### Current todo list")]
    assert listed == ["### Current todo list\n- 1 [open] Book hotel"]
