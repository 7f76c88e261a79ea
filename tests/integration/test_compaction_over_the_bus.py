"""The compaction service on a real nats-server: summaries asked of the model router on their own
route and span, failures that leave the prompt as it was, typed errors for bad specs, and a long
session whose every model call stays under the agent's budget while history keeps everything."""

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    CompactRequest,
    FunctionCallContent,
    FunctionResultContent,
    HistoryLoad,
    TextContent,
)
from runbus.messages.compaction import (
    CompactionStrategy,
    SummarizationCompaction,
    TurnsExceed,
)
from runbus.service import Service, ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_compaction.service import CompactionService
from runbus_compaction.tokens import estimate_tokens
from runbus_examples.models import default_routes
from runbus_examples.scripted import ScriptedReply
from runbus_gateway.agents import AgentSpec, CompactionPolicy
from runbus_model_router.service import ModelRouterService
from tests.helpers import publish_and_collect, raw_request
from tests.stack import SecuredNats, start_stack

SCRIPTS = {
    "summarizer": [ScriptedReply(text="The user asked about the weather in three cities.")],
    "mute": [ScriptedReply(text="")],
}
CTX = RunContext(run_id="r-cmp", session_id="s1", props={"tenant": "acme", "user_id": "alice"})


@pytest.fixture
async def compaction(nats_server: SecuredNats, spans: InMemorySpanExporter) -> AsyncIterator[Bus]:
    """Compaction and a model router with scripted routes, each on its own connection; the
    returned bus is a client's."""
    async with AsyncExitStack() as stack:
        builders: list[tuple[str, Callable[[NATS, ServiceOptions], Service]]] = [
            (
                ModelRouterService.name,
                lambda nc, options: ModelRouterService(
                    nc, default_routes(SCRIPTS), options=options
                ),
            ),
            (CompactionService.name, lambda nc, options: CompactionService(nc, options=options)),
        ]
        for name, build in builders:
            nc = await nats.connect(nats_server.url)
            stack.push_async_callback(nc.drain)
            provider = create_tracer_provider(name, processors=[SimpleSpanProcessor(spans)])
            service = build(nc, ServiceOptions(tracer_provider=provider))
            await service.start()
            stack.push_async_callback(service.stop)
        client = await nats.connect(nats_server.url)
        stack.push_async_callback(client.drain)
        provider = create_tracer_provider("test", processors=[SimpleSpanProcessor(spans)])
        yield Bus(client, provider.get_tracer("test"))


def conversation(turns: int) -> list[ChatMessage]:
    prompt = [
        ChatMessage(
            role="system",
            contents=[TextContent(text="You are a travel assistant.")],
            message_id="i",
        )
    ]
    for i in range(turns):
        prompt += [
            ChatMessage(
                role="user",
                contents=[TextContent(text=f"Weather in city {i}?")],
                message_id=f"u{i}",
            ),
            ChatMessage(
                role="assistant",
                contents=[FunctionCallContent(call_id=f"c{i}", name="get_weather")],
                message_id=f"a{i}",
            ),
            ChatMessage(
                role="tool",
                contents=[FunctionResultContent(call_id=f"c{i}", result={"temperature_c": 20 + i})],
                message_id=f"t{i}",
            ),
            ChatMessage(
                role="assistant", contents=[TextContent(text=f"{20 + i}°C.")], message_id=f"r{i}"
            ),
        ]
    return prompt


def ancestors(span: ReadableSpan, finished: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    by_id = {s.context.span_id: s for s in finished}
    chain = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        chain.append(span)
    return chain


def summarising(route: str) -> CompactionStrategy:
    return SummarizationCompaction(trigger=TurnsExceed(turns=1), minimum_preserved=4, route=route)


async def test_summarization_goes_through_the_model_router_as_its_own_span_on_its_route(
    compaction: Bus, spans: InMemorySpanExporter
) -> None:
    request = CompactRequest(messages=conversation(4), strategy=summarising("scripted/summarizer"))

    result = await compaction.call(ops.COMPACTION_COMPACT, request, ctx=CTX)

    assert result.compacted
    summary = result.messages[1]
    assert summary.text == "[Summary]\nThe user asked about the weather in three cities."
    assert summary.source == "compaction"
    assert [m.message_id for m in result.messages[2:]] == ["r2", "u3", "a3", "t3", "r3"]
    assert result.report.usage.output_tokens > 0

    finished = spans.get_finished_spans()
    served = next(s for s in finished if s.name == "process runbus.compaction.compact")
    [chat] = [
        s
        for s in finished
        if s.name.startswith("chat ")
        and (s.attributes or {}).get("gen_ai.request.model") == "scripted/summarizer"
    ]
    # chat ← process runbus.model.complete ← send … ← summarize ← process …compaction.compact
    assert [s.name for s in ancestors(chat, finished)][:4] == [
        "process runbus.model.complete",
        "send runbus.model.complete",
        "summarize scripted/summarizer",
        "process runbus.compaction.compact",
    ]
    attributes: dict[str, Any] = dict(served.attributes or {})
    assert attributes["runbus.compaction.strategy"] == "summarization"
    assert attributes["runbus.compaction.compacted"] is True
    assert attributes["runbus.compaction.tokens.before"] == result.report.tokens_before
    assert attributes["runbus.compaction.tokens.after"] == result.total_tokens
    assert list(attributes["runbus.compaction.excluded_message_ids"]) == (
        result.report.excluded_message_ids
    )
    assert list(attributes["runbus.compaction.steps"]) == ["$:summarization:compacted"]


async def test_a_blank_summary_over_the_bus_becomes_summary_unavailable(compaction: Bus) -> None:
    request = CompactRequest(messages=conversation(3), strategy=summarising("scripted/mute"))

    result = await compaction.call(ops.COMPACTION_COMPACT, request, ctx=CTX)

    assert result.messages[1].text == "[Summary]\n[Summary unavailable]"


async def test_a_summary_on_an_unknown_route_leaves_the_prompt_whole_and_reports_why(
    compaction: Bus, spans: InMemorySpanExporter
) -> None:
    prompt = conversation(4)
    request = CompactRequest(messages=prompt, strategy=summarising("scripted/nobody"))

    result = await compaction.call(ops.COMPACTION_COMPACT, request, ctx=CTX)

    assert result.messages == prompt
    assert not result.compacted
    [step] = result.report.steps
    assert step.error is not None
    assert step.error.code == "unknown_route"
    served = next(
        s for s in spans.get_finished_spans() if s.name == "process runbus.compaction.compact"
    )
    attributes: dict[str, Any] = dict(served.attributes or {})
    [failure] = attributes["runbus.compaction.failures"]
    assert failure.startswith("$:unknown_route: no model route 'scripted/nobody'")


async def test_with_no_model_router_running_the_summary_fails_soft(
    nats_server: SecuredNats, nc: NATS
) -> None:
    service = CompactionService(await nats.connect(nats_server.url))
    await service.start()
    await service.nc.flush()
    try:
        prompt = conversation(3)
        request = CompactRequest(messages=prompt, strategy=summarising("cheap"))
        bus = Bus(nc, create_tracer_provider("test").get_tracer("test"))

        result = await bus.call(ops.COMPACTION_COMPACT, request, ctx=CTX)
    finally:
        await service.stop()
        await service.nc.drain()

    assert result.messages == prompt
    assert result.report.steps[0].error is not None
    assert result.report.steps[0].error.code == "unavailable"


@pytest.mark.parametrize(
    ("strategy", "messages", "names"),
    [
        (
            {"strategy": "truncation", "trigger": {"condition": "tokens_exceed", "tokens": -1}},
            1,
            "$.strategy.trigger.tokens",
        ),
        (
            {"strategy": "truncation", "trigger": {"condition": "eventually"}},
            1,
            "$.strategy.trigger.condition",
        ),
        ({"strategy": "none"}, 0, "no messages"),
    ],
    ids=["negative_number", "unknown_trigger", "empty_prompt"],
)
async def test_a_bad_spec_or_an_empty_prompt_gets_a_typed_bad_request(
    compaction: Bus, nc: NATS, strategy: dict[str, object], messages: int, names: str
) -> None:
    body = {
        "type": "compaction.compact",
        "messages": [{"role": "user", "contents": [{"type": "text", "text": "Hi"}]}] * messages,
        "strategy": strategy,
    }

    reply: Msg = await nc.request(subjects.COMPACTION_COMPACT, json.dumps(body).encode())

    assert reply.headers is not None
    assert reply.headers["rb-error"] == "bad_request"
    error = msgspec.json.decode(reply.data)["error"]
    assert error["code"] == "bad_request"
    assert names in error["message"]


async def test_the_service_keeps_serving_after_a_bad_request(compaction: Bus, nc: NATS) -> None:
    await nc.request(subjects.COMPACTION_COMPACT, b'{"type": "compaction.compact"}')

    result = await compaction.call(
        ops.COMPACTION_COMPACT,
        CompactRequest(messages=conversation(1), strategy=summarising("scripted/summarizer")),
        ctx=CTX,
    )

    assert len(result.messages) == 5


# A long session through the whole stack --------------------------------------------------------

BUDGET = 1200
TURNS = 60


@pytest.mark.slow
async def test_a_60_turn_session_stays_under_the_agents_budget_on_every_model_call(
    nats_server: SecuredNats, nc: NATS, tmp_path: Path
) -> None:
    agent = AgentSpec(
        name="travel",
        instructions="You find flights.",
        model="offline",
        tools=["search_flights"],
        compaction=CompactionPolicy(max_tokens=BUDGET),
    )
    seen: list[list[ChatMessage]] = []

    async def record(msg: Msg) -> None:
        seen.append(ops.MODEL_COMPLETE.decode.decode(msg.data).messages)

    # A plain subscriber gets a copy of every request the model router's queue group serves.
    watcher = await nc.subscribe(subjects.MODEL_COMPLETE, cb=record)
    async with start_stack(nats_server.url, data_dir=tmp_path, agents={"travel": agent}) as stack:
        for turn in range(TURNS):
            ask = f"Find flights from Melbourne to Sydney on 2026-12-{1 + turn % 28:02d}"
            events = await publish_and_collect(nc, f"r-{turn}", raw_request(f"r-{turn}", ask))
            assert events[-1]["type"] == "run.completed", events[-1]
        await watcher.unsubscribe()
        bus = Bus(nc, stack.providers["gateway"].get_tracer("test"))
        history = await bus.call(
            ops.HISTORY_LOAD,
            HistoryLoad(session_id="s1"),
            ctx=RunContext(session_id="s1", props={"tenant": "acme", "user_id": "alice"}),
        )

    assert len(seen) == 2 * TURNS
    sizes = [sum(estimate_tokens(m) for m in prompt) for prompt in seen]
    assert max(sizes) <= BUDGET
    whole = sum(estimate_tokens(m) for m in history.messages)
    assert whole > 5 * BUDGET  # so the budget was not kept by a short session
    assert [m.role for m in history.messages] == ["user", "assistant", "tool", "assistant"] * TURNS
    # The last call saw the question of its own run, and its tool result whole.
    last = seen[-1]
    assert last[-2].function_calls
    assert last[-1].function_results
    last_day = f"2026-12-{1 + (TURNS - 1) % 28:02d}"
    assert any(m.role == "user" and last_day in m.text for m in last)
