"""Whole runs through the gateway with an OpenAI-compatible model behind the router: streamed
text reaches the client while the provider is still writing; parallel tool calls run."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from runbus_gateway.agents import AgentSpec
from runbus_model_router.config import BackendConfig
from runbus_model_router.openai_chat import OpenAIChatModel, open_client
from tests.helpers import raw_request
from tests.integration.model_provider import LoopbackProvider, loopback, text_reply, tool_reply
from tests.stack import SecuredNats, start_stack

AGENT = AgentSpec(name="chat", instructions="You are brief.", model="cheap", tools=["get_weather"])


@asynccontextmanager
async def stack_with(url: str, data_dir: Path) -> AsyncIterator[LoopbackProvider]:
    """The six services, the `chat` agent on route `cheap`, `cheap` at a loopback provider."""
    async with loopback() as provider:
        backend = BackendConfig(base_url=provider.base_url)
        client = open_client("lb", backend)
        model = OpenAIChatModel(client, model="small-1", config=backend, timeout=10)
        try:
            async with start_stack(
                url, data_dir=data_dir, agents={"chat": AGENT}, routes={"cheap": model}
            ):
                yield provider
        finally:
            await client.close()


async def next_event(subscription: Any) -> dict[str, Any]:
    event: dict[str, Any] = msgspec.json.decode((await subscription.next_msg(timeout=60)).data)
    return event


async def test_a_runs_first_text_delta_reaches_the_client_before_the_provider_has_finished(
    nats_server: SecuredNats, nc: NATS, tmp_path: Path
) -> None:
    async with stack_with(nats_server.url, tmp_path / "data") as provider:
        slow = text_reply("Hello there, traveller.", pause_after=1)
        provider.script(slow)
        events = await nc.subscribe("runbus.events.*.*.r-stream")
        await nc.jetstream().publish(
            "runbus.runs.chat",
            raw_request("r-stream", "Hi!", agent="chat"),
            headers={"Nats-Msg-Id": "r-stream", "rb-auth": "Bearer dev-alice"},
        )
        seen = [await next_event(events)]
        while seen[-1]["type"] != "run.text_delta":
            seen.append(await next_event(events))
        finished_at_first_delta = provider.finished
        slow.resume.set()
        while seen[-1]["type"] not in ("run.completed", "run.failed"):
            seen.append(await next_event(events))
        await events.unsubscribe()

    assert finished_at_first_delta == 0
    assert seen[-1]["type"] == "run.completed"
    deltas = "".join(e["delta"] for e in seen if e["type"] == "run.text_delta")
    assert deltas == seen[-1]["text"] == "Hello there, traveller."


async def test_parallel_tool_calls_from_the_provider_run_and_their_usage_is_summed(
    nats_server: SecuredNats, nc: NATS, tmp_path: Path
) -> None:
    async with stack_with(nats_server.url, tmp_path / "data") as provider:
        provider.script(
            tool_reply(
                [
                    ("c-1", "get_weather", '{"city": "Sydney"}'),
                    ("c-2", "get_weather", '{"city": "Perth"}'),
                ],
                usage=(100, 20),
            ),
            text_reply("Both sunny.", usage=(300, 4)),
        )
        events = await nc.subscribe("runbus.events.*.*.r-tools")
        await nc.jetstream().publish(
            "runbus.runs.chat",
            raw_request("r-tools", "Weather in Sydney and Perth?", agent="chat"),
            headers={"Nats-Msg-Id": "r-tools", "rb-auth": "Bearer dev-alice"},
        )
        seen = [await next_event(events)]
        while seen[-1]["type"] not in ("run.completed", "run.failed"):
            seen.append(await next_event(events))
        await events.unsubscribe()

    done = seen[-1]
    assert done["type"] == "run.completed", done
    results = [e["result"] for e in seen if e["type"] == "run.tool_result"]
    assert sorted(r["call_id"] for r in results) == ["c-1", "c-2"]
    assert all(r["error"] is None for r in results)
    # No prices on this route: the run costs nothing.
    assert done["usage"] == {"input_tokens": 400, "output_tokens": 24, "cost": 0.0}
    tool_messages = [m for m in provider.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["c-1", "c-2"]
    assert "Sydney" in tool_messages[0]["content"]
