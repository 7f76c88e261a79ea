"""The client's own tools (OpenAI `tools`, LangChain's `bind_tools`, AG-UI frontend tools) are
refused with a typed 400 naming the field, and no run starts: never the agent's own answer as
if the client's tools had been offered."""

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from ag_ui import core as ag
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import SecretStr

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages.runs import RunList
from tests.integration.ingress.conftest import ALICE

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "local_weather",
        "description": "The weather where the user is, read from their device.",
        "parameters": {"type": "object", "properties": {}},
    },
}


@pytest.fixture
async def sdk(served: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{served}/v1", api_key="dev-alice", max_retries=0) as c:
        yield c


async def run_ids(client: RunbusClient) -> set[str]:
    listed = await client.call(ops.API_RUNS_LIST, RunList(limit=1000))
    return {record.run_id for record in listed.records}


async def test_openai_tools_are_refused_streamed_or_not_and_no_run_starts(
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
        assert (refused.code, refused.type) == ("unsupported_request", "invalid_request_error")
        assert "'travel' does not accept the client's own tools" in refused.message
        assert "'local_weather'" in refused.message
    assert await run_ids(alice) == before


async def test_a_request_without_tools_still_runs_the_agent(sdk: AsyncOpenAI) -> None:
    user: Any = [{"role": "user", "content": "Weather in Sydney?"}]
    completion = await sdk.chat.completions.create(model="travel", messages=user, tools=[])

    assert completion.choices[0].finish_reason == "stop"


async def test_langchain_bind_tools_gets_a_bad_request_error_naming_the_tool(
    served: str,
) -> None:
    @tool
    def local_weather(city: str) -> str:
        """The weather where the user is, read from their device."""
        return f"sunny in {city}"

    chat = ChatOpenAI(
        model="travel",
        base_url=f"{served}/v1",
        api_key=SecretStr("dev-alice"),
        max_retries=0,
    ).bind_tools([local_weather])
    with pytest.raises(openai.BadRequestError) as refused:
        await chat.ainvoke("Weather here?")

    assert refused.value.code == "unsupported_request"
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

    assert (status, error["code"]) == (400, "unsupported_request")
    assert "'local_weather'" in error["message"]
