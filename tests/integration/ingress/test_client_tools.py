"""The client's own tools over HTTP, with the clients people use: the openai SDK (streamed and
not) and LangChain's `bind_tools` get the model's call with `finish_reason: "tool_calls"`,
answer it with a `tool` message, and the same run goes on to its answer. An agent that takes
no client tools refuses them with a typed 400 (OpenAI, LangChain, AG-UI), and starts no run."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import openai
import pytest
from ag_ui import core as ag
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import SecretStr

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import ModelRequest
from runbus.messages.runs import RunList
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from tests.integration.ingress.conftest import ALICE, ingress
from tests.integration.ingress.test_agui import read_agui
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "local_weather",
        "description": "The weather where the user is, read from their device.",
        "parameters": {"type": "object", "properties": {}},
    },
}
TRAVEL = msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")
DEVICE = msgspec.structs.replace(TRAVEL, name="device", client_tools=True)


def ask_the_device(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    if step == 0:
        return call("local_weather", "c-local", unit="celsius")
    result = [r for m in request.messages for r in m.function_results][-1]
    return text(f"Where you are: {result.error or result.result}")


@pytest.fixture
async def device(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[str]:
    """Base URL of an ingress in front of a stack whose `device` agent takes client tools."""
    model = GatedModel(ask_the_device)
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents={"device": DEVICE}, routes={"gated": model}
        ),
        ingress(nats_server.url) as (base, _),
    ):
        yield base


def sdk_for(base: str, token: str = "dev-alice") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)


async def test_the_openai_sdk_gets_the_call_answers_it_and_the_same_run_answers(
    device: str,
) -> None:
    user: Any = {"role": "user", "content": "Weather here?"}
    async with sdk_for(device) as sdk:
        handed = await sdk.chat.completions.create(
            model="device", messages=[user], tools=[WEATHER_TOOL]
        )
        [called] = handed.choices[0].message.tool_calls or []
        answered = await sdk.chat.completions.create(
            model="device",
            messages=[
                user,
                handed.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": called.id, "content": "18°C, light rain"},
            ],
            tools=[WEATHER_TOOL],
        )

    assert handed.choices[0].finish_reason == "tool_calls"
    assert called.type == "function"
    assert (called.function.name, called.function.arguments) == (
        "local_weather",
        '{"unit":"celsius"}',
    )
    assert answered.choices[0].finish_reason == "stop"
    assert answered.choices[0].message.content == "Where you are: 18°C, light rain"
    assert answered.id == handed.id  # one run, paused and resumed


async def test_a_streamed_completion_hands_the_call_as_tool_call_deltas_then_resumes(
    device: str,
) -> None:
    user: Any = {"role": "user", "content": "Weather here?"}
    async with sdk_for(device) as sdk:
        first = await sdk.chat.completions.create(
            model="device", messages=[user], tools=[WEATHER_TOOL], stream=True
        )
        deltas = [c async for c in first]
        calls = [t for c in deltas for ch in c.choices for t in (ch.delta.tool_calls or [])]
        finishes = [ch.finish_reason for c in deltas for ch in c.choices if ch.finish_reason]
        [handed] = calls
        assert handed.id is not None
        assert handed.function is not None
        second = await sdk.chat.completions.create(
            model="device",
            messages=[
                user,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": handed.id,
                            "type": "function",
                            "function": {"name": "local_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": handed.id, "content": "warm"},
            ],
            tools=[WEATHER_TOOL],
            stream=True,
        )
        text_out = "".join([c.choices[0].delta.content or "" async for c in second if c.choices])

    assert finishes == ["tool_calls"]
    assert handed.function.name == "local_weather"
    assert text_out == "Where you are: warm"


async def test_langchain_bind_tools_round_trips_a_call_of_the_clients_tool(device: str) -> None:
    @tool
    def local_weather(unit: str) -> str:
        """The weather where the user is, read from their device."""
        return f"21 degrees {unit}"

    chat = ChatOpenAI(
        model="device", base_url=f"{device}/v1", api_key=SecretStr("dev-alice"), max_retries=0
    ).bind_tools([local_weather])
    asked = HumanMessage("Weather here?")
    reply = await chat.ainvoke([asked])
    assert isinstance(reply, AIMessage)
    [called] = reply.tool_calls
    result = local_weather.invoke(called["args"])
    final = await chat.ainvoke([asked, reply, ToolMessage(result, tool_call_id=called["id"])])

    assert called["name"] == "local_weather"
    assert called["args"] == {"unit": "celsius"}
    assert final.content == "Where you are: 21 degrees celsius"


async def test_bob_cannot_answer_alices_pending_call_over_http(device: str) -> None:
    user: Any = {"role": "user", "content": "Weather here?"}
    async with sdk_for(device) as alice, sdk_for(device, "dev-bob") as bob:
        handed = await alice.chat.completions.create(
            model="device", messages=[user], tools=[WEATHER_TOOL]
        )
        [called] = handed.choices[0].message.tool_calls or []
        forged: Any = [user, {"role": "tool", "tool_call_id": called.id, "content": "forged"}]
        with pytest.raises(openai.NotFoundError) as refused:
            await bob.chat.completions.create(model="device", messages=forged)
        answered = await alice.chat.completions.create(
            model="device",
            messages=[user, {"role": "tool", "tool_call_id": called.id, "content": "true"}],
        )

    assert refused.value.code == "not_found"
    assert answered.choices[0].message.content == "Where you are: true"


@pytest.fixture
async def sdk(served: str) -> AsyncIterator[AsyncOpenAI]:
    async with sdk_for(served) as c:
        yield c


async def run_ids(client: RunbusClient) -> set[str]:
    listed = await client.call(ops.API_RUNS_LIST, RunList(limit=1000))
    return {record.run_id for record in listed.records}


async def test_an_agent_without_client_tools_refuses_them_streamed_or_not_and_runs_nothing(
    sdk: AsyncOpenAI, alice: RunbusClient
) -> None:
    before = await run_ids(alice)
    user: Any = [{"role": "user", "content": "Weather here?"}]
    with pytest.raises(openai.BadRequestError) as whole:
        await sdk.chat.completions.create(model="travel", messages=user, tools=[WEATHER_TOOL])
    with pytest.raises(openai.BadRequestError) as streamed:
        await sdk.chat.completions.create(
            model="travel", messages=user, tools=[WEATHER_TOOL], stream=True
        )

    for refused in (whole.value, streamed.value):
        assert (refused.code, refused.type) == ("bad_request", "invalid_request_error")
        assert "'travel' does not accept the client's own tools" in refused.message
        assert "'local_weather'" in refused.message
    assert await run_ids(alice) == before


async def test_a_request_with_an_empty_tools_list_still_runs_the_agent(sdk: AsyncOpenAI) -> None:
    user: Any = [{"role": "user", "content": "Weather in Sydney?"}]
    completion = await sdk.chat.completions.create(model="travel", messages=user, tools=[])

    assert completion.choices[0].finish_reason == "stop"


async def test_langchain_bind_tools_on_an_agent_without_them_is_a_bad_request(
    served: str,
) -> None:
    @tool
    def local_weather(city: str) -> str:
        """The weather where the user is, read from their device."""
        return f"sunny in {city}"

    chat = ChatOpenAI(
        model="travel", base_url=f"{served}/v1", api_key=SecretStr("dev-alice"), max_retries=0
    ).bind_tools([local_weather])
    with pytest.raises(openai.BadRequestError) as refused:
        await chat.ainvoke("Weather here?")

    assert refused.value.code == "bad_request"
    assert "'local_weather'" in refused.value.message


async def test_agui_frontend_tools_are_refused_with_a_typed_400(
    http: aiohttp.ClientSession,
) -> None:
    body = ag.RunAgentInput(
        thread_id="ag-client-tools",
        run_id="r-ag-client-tools",
        messages=[ag.UserMessage(id="u1", content="Weather here?")],
        state={},
        tools=[ag.Tool(name="local_weather", description="Device weather", parameters={})],
        context=[],
        forwarded_props={},
    )
    headers = {**ALICE, "Content-Type": "application/json"}
    data = body.model_dump_json(by_alias=True)
    async with http.post("/v1/agui/travel", data=data, headers=headers) as r:
        status, error = r.status, (await r.json())["error"]

    assert (status, error["code"]) == (400, "bad_request")
    assert "'local_weather'" in error["message"]


async def test_an_agui_client_gets_the_frontend_tool_call_and_its_answer_resumes_the_run(
    device: str,
) -> None:
    tools = [ag.Tool(name="local_weather", description="Device weather", parameters={})]
    asked = ag.UserMessage(id="u1", content="Weather here?")
    headers = {**ALICE, "Content-Type": "application/json"}

    def agui_input(run_id: str, messages: list[Any]) -> str:
        body = ag.RunAgentInput(
            thread_id="ag-device",
            run_id=run_id,
            messages=messages,
            state={},
            tools=tools,
            context=[],
            forwarded_props={},
        )
        return body.model_dump_json(by_alias=True)

    async with aiohttp.ClientSession(device) as http:
        async with http.post(
            "/v1/agui/device", data=agui_input("ag-1", [asked]), headers=headers
        ) as r:
            first = await read_agui(r)
        [start] = [e for e in first if isinstance(e, ag.ToolCallStartEvent)]
        called = ag.AssistantMessage(
            id="a1",
            tool_calls=[
                ag.ToolCall(
                    id=start.tool_call_id,
                    function=ag.FunctionCall(name="local_weather", arguments="{}"),
                )
            ],
        )
        result = ag.ToolMessage(id="t1", tool_call_id=start.tool_call_id, content="warm")
        async with http.post(
            "/v1/agui/device", data=agui_input("ag-2", [asked, called, result]), headers=headers
        ) as r:
            second = await read_agui(r)

    assert [type(e).__name__ for e in first][-4:] == [
        "ToolCallStartEvent",
        "ToolCallArgsEvent",
        "ToolCallEndEvent",
        "RunFinishedEvent",
    ]
    assert start.tool_call_name == "local_weather"
    assert isinstance(second[0], ag.RunStartedEvent)
    assert isinstance(second[-1], ag.RunFinishedEvent)
    text_out = "".join(e.delta for e in second if isinstance(e, ag.TextMessageContentEvent))
    assert text_out == "Where you are: warm"


async def test_an_openai_client_answers_a_call_handed_before_a_restart_of_every_service(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    model = GatedModel(ask_the_device)
    user: Any = {"role": "user", "content": "Weather here?"}
    options: Any = {
        "agents": {"device": DEVICE},
        "routes": {"gated": model},
        "gateway_options": {"ack_wait": 1.0, "stop_grace": 0.2},
    }
    async with ingress(nats_server.url) as (base, _), sdk_for(base) as sdk:
        async with start_stack(nats_server.url, data_dir=tmp_path / "a", **options):
            handed = await sdk.chat.completions.create(
                model="device", messages=[user], tools=[WEATHER_TOOL]
            )
        [called] = handed.choices[0].message.tool_calls or []
        async with start_stack(nats_server.url, data_dir=tmp_path / "b", **options):
            answered = await sdk.chat.completions.create(
                model="device",
                messages=[user, {"role": "tool", "tool_call_id": called.id, "content": "mild"}],
            )

    assert answered.id == handed.id
    assert answered.choices[0].message.content == "Where you are: mild"
    assert len(model.requests) == 2
