"""The client's own tools through the whole stack: the model's call of one goes to the client
in the run's events, the run waits for the answer durably (across a restart of every
service), the answer resumes the same run; only the run's owner can see or answer it."""

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgspec
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import (
    HistoryLoad,
    ModelRequest,
    RunCompleted,
    RunFailed,
    RunToolCall,
    ToolSpec,
)
from runbus.messages.runs import ClientToolAnswer, RunCancel, RunGet, RunRecord
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from tests.helpers import eventually
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, Stack, start_stack

TRAVEL = msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")
AGENTS = {
    "travel": msgspec.structs.replace(TRAVEL, client_tools=True),
    "closed": msgspec.structs.replace(TRAVEL, name="closed"),
}
GATEWAY = {"ack_wait": 1.0, "stop_grace": 0.2}
LOCAL_WEATHER = ToolSpec(
    name="local_weather",
    description="The weather at the user's device.",
    parameters={"type": "object", "properties": {}},
)


def ask_the_device(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    if step == 0:
        assert "local_weather" in [t.name for t in request.tools]
        return call("local_weather", "c-local")
    result = [r for m in request.messages for r in m.function_results][-1]
    return text(f"Where you are: {result.error or result.result}")


def stack(
    nats_server: SecuredNats, data_dir: Path, model: GatedModel
) -> AbstractAsyncContextManager[Stack]:
    return start_stack(
        nats_server.url,
        data_dir=data_dir,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options=GATEWAY,
    )


async def client_call(client: RunbusClient, run_id: str) -> RunToolCall:
    """Follow the run until it hands a call to the client; fail if it ends first."""
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunToolCall) and item.event.client:
            return item.event
        assert not isinstance(item.event, RunCompleted | RunFailed), item.event
    raise AssertionError(f"run {run_id} handed no call to the client")


async def final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


async def test_a_client_tool_call_waits_across_a_restart_and_the_answer_resumes_the_same_run(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = GatedModel(ask_the_device)
    async with stack(nats_server, tmp_path / "a", model):
        run_id = await alice.start(
            "travel", "Weather here?", session_id="device", client_tools=[LOCAL_WEATHER]
        )
        handed = await client_call(alice, run_id)

        async def waiting_for_the_client() -> RunRecord | None:
            record = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
            return record if record.status == "waiting_approval" else None

        # The call event is stored before the run starts waiting (and says so).
        waiting = await eventually(waiting_for_the_client, what="the run waiting for the client")
    # Every service is gone; the call is checkpointed in history, pending in KV.
    async with stack(nats_server, tmp_path / "b", model):
        await alice.call(
            ops.API_CLIENT_TOOLS_ANSWER,
            ClientToolAnswer(run_id=run_id, call_id="c-local", result="18°C, light rain"),
        )
        ended = await final(alice, run_id)
        with pytest.raises(RemoteError) as again:
            await alice.call(
                ops.API_CLIENT_TOOLS_ANSWER,
                ClientToolAnswer(run_id=run_id, call_id="c-local", result="sunny"),
            )
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="device"))

    assert (handed.call.name, handed.client, handed.client_calls) == ("local_weather", True, 1)
    assert waiting is not None
    assert waiting.status == "waiting_approval"
    assert isinstance(ended, RunCompleted)
    assert ended.text == "Where you are: 18°C, light rain"
    # One model call asked for the tool, one read its answer: nothing was asked twice.
    assert len(model.requests) == 2
    results = [r for m in history.messages for r in m.function_results]
    assert [(r.call_id, r.result) for r in results] == [("c-local", "18°C, light rain")]
    assert again.value.remote_code == "conflict"


async def test_another_user_or_tenant_can_neither_see_nor_answer_a_client_tool_pause(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = GatedModel(ask_the_device)
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start(
            "travel", "Weather here?", session_id="private", client_tools=[LOCAL_WEATHER]
        )
        await client_call(alice, run_id)
        refusals = {}
        for attacker in ("bob", "carol"):
            other = users[attacker]
            with pytest.raises(RemoteError) as answered:
                await other.call(
                    ops.API_CLIENT_TOOLS_ANSWER,
                    ClientToolAnswer(run_id=run_id, call_id="c-local", result="forged"),
                )
            with pytest.raises(RemoteError) as looked:
                await other.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
            refusals[attacker] = (answered.value.remote_code, looked.value.remote_code)
        await alice.call(
            ops.API_CLIENT_TOOLS_ANSWER,
            ClientToolAnswer(run_id=run_id, call_id="c-local", result="warm"),
        )
        ended = await final(alice, run_id)

    assert refusals == {"bob": ("not_found", "not_found"), "carol": ("not_found", "not_found")}
    assert isinstance(ended, RunCompleted)
    assert ended.text == "Where you are: warm"


async def test_an_agent_that_takes_no_client_tools_refuses_a_run_that_brings_them(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = GatedModel(ask_the_device)
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start(
            "closed", "Weather here?", session_id="closed", client_tools=[LOCAL_WEATHER]
        )
        ended = await final(alice, run_id)

    assert isinstance(ended, RunFailed)
    assert ended.error.code == "bad_request"
    assert "'closed' does not accept the client's own tools ('local_weather')" in (
        ended.error.message
    )
    assert model.requests == []


async def test_a_run_cancelled_while_it_waits_for_the_client_closes_its_call(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    async with stack(nats_server, tmp_path, GatedModel(ask_the_device)):
        run_id = await alice.start(
            "travel", "Weather here?", session_id="cancelled", client_tools=[LOCAL_WEATHER]
        )
        await client_call(alice, run_id)
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        ended = await final(alice, run_id)
        with pytest.raises(RemoteError) as late:
            await alice.call(
                ops.API_CLIENT_TOOLS_ANSWER,
                ClientToolAnswer(run_id=run_id, call_id="c-local", result="too late"),
            )

    assert isinstance(ended, RunFailed)
    assert ended.error.code == "cancelled"
    assert late.value.remote_code == "conflict"
    assert "withdrawn" in late.value.message
