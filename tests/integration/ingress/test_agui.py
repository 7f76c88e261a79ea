"""A run as an AG-UI event stream, decoded with the `ag-ui-protocol` package's own types: the
run's lifecycle, its text, its tool calls and results, and the todo list as state snapshots."""

import json
from pathlib import Path

import aiohttp
import msgspec
import pydantic
from ag_ui import core as ag

from runbus.client import RunbusClient
from runbus.messages import ModelRequest, RunCompleted
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.harness.config import HarnessConfig, TodosConfig
from tests.integration.ingress.conftest import ALICE, BOB, ingress
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

EVENT = pydantic.TypeAdapter(ag.Event)


async def read_agui(response: aiohttp.ClientResponse) -> list[ag.BaseEvent]:
    """Every `data:` line of the stream, validated as an AG-UI event."""
    assert response.status == 200, await response.text()
    assert response.content_type == "text/event-stream"
    events: list[ag.BaseEvent] = []
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            events.append(EVENT.validate_json(line.removeprefix("data: ")))
    return events


def run_input(thread_id: str, run_id: str, text: str) -> str:
    body = ag.RunAgentInput(
        thread_id=thread_id,
        run_id=run_id,
        messages=[ag.UserMessage(id="u1", content=text)],
        state={},
        tools=[],
        context=[],
        forwarded_props={},
    )
    return body.model_dump_json(by_alias=True)


async def test_an_agui_client_sees_the_run_start_call_a_tool_stream_text_and_finish(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    body = run_input("ag-thread", "r-agui", "Weather in Sydney?")
    headers = {**ALICE, "Content-Type": "application/json"}
    async with http.post("/v1/agui/travel", data=body, headers=headers) as response:
        events = await read_agui(response)
    async with http.get("/v1/runs/r-agui/agui", headers=ALICE) as response:
        watched = await read_agui(response)
    final = None
    async for item in alice.follow("r-agui", timeout=10):
        final = item.event
    assert isinstance(final, RunCompleted)
    kinds = [str(e.type.value) for e in events]
    started, finished = events[0], events[-1]
    call_id = next(e.tool_call_id for e in events if isinstance(e, ag.ToolCallStartEvent))
    args = "".join(e.delta for e in events if isinstance(e, ag.ToolCallArgsEvent))
    result = next(e for e in events if isinstance(e, ag.ToolCallResultEvent))
    said = "".join(e.delta for e in events if isinstance(e, ag.TextMessageContentEvent))

    assert isinstance(started, ag.RunStartedEvent)
    assert (started.thread_id, started.run_id) == ("ag-thread", "r-agui")
    assert isinstance(finished, ag.RunFinishedEvent)
    assert finished.result == {"text": final.text, "usage": msgspec.to_builtins(final.usage)}
    assert kinds[1] == "STATE_SNAPSHOT"
    assert [k for k in kinds if k.startswith("TOOL_CALL")] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    assert json.loads(args) == {"city": "Sydney"}
    assert result.tool_call_id == call_id
    assert isinstance(result.content, str)
    assert json.loads(result.content)["city"] == "Sydney"
    assert said == final.text
    assert kinds.index("TEXT_MESSAGE_START") < kinds.index("TEXT_MESSAGE_END")
    assert [type(e) for e in watched] == [type(e) for e in events]  # the same run, replayed


async def test_the_todo_list_arrives_as_state_snapshots_when_it_changes(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    def plan(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        if step == 0:
            return call("todos_add", "c-add", todos=[{"title": "Book flight"}])
        if step == 1:
            return call("todos_complete", "c-done", items=[{"id": 1, "reason": "booked"}])
        return text("All done.")

    planner = msgspec.structs.replace(
        load_agents(AGENTS_DIR)["travel"],
        name="planner",
        model="gated",
        harness=HarnessConfig(todos=TodosConfig(enabled=True)),
    )
    model = GatedModel(plan)
    body = run_input("ag-todos", "r-todos", "Plan my trip")
    headers = {**ALICE, "Content-Type": "application/json"}
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents={"planner": planner}, routes={"gated": model}
        ),
        ingress(nats_server.url) as (_, http),
        http.post("/v1/agui/planner", data=body, headers=headers) as response,
    ):
        events = await read_agui(response)

    snapshots = [e.snapshot["todos"] for e in events if isinstance(e, ag.StateSnapshotEvent)]
    assert [[(t["title"], t["done"]) for t in s] for s in snapshots] == [
        [],
        [("Book flight", False)],
        [("Book flight", True)],
    ]
    assert isinstance(events[-1], ag.RunFinishedEvent)


async def test_agui_refuses_bad_input_and_another_users_run(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    await alice.run("travel", "Weather in Perth?", session_id="ag-own", run_id="r-ag-own")
    headers = {**ALICE, "Content-Type": "application/json"}
    answers = []
    async with http.post("/v1/agui/travel", data=b'{"thread_id": 1}', headers=headers) as r:
        answers.append((r.status, (await r.json())["error"]["code"]))
    no_user = run_input("ag-x", "r-ag-x", " ")
    async with http.post("/v1/agui/travel", data=no_user, headers=headers) as r:
        answers.append((r.status, (await r.json())["error"]["code"]))
    async with http.get("/v1/runs/r-ag-own/agui", headers=BOB) as r:
        answers.append((r.status, (await r.json())["error"]["code"]))

    assert answers == [(400, "bad_request"), (400, "bad_request"), (404, "not_found")]
