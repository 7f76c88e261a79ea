"""The in-process anchor: the same travel agent on Microsoft Agent Framework (agent-framework-core)
with a chat client that returns the same four scripted replies (three tool calls, then the text)
and the same three tools, so runbus's whole-run numbers have an in-process peer to be read
against. MAF's own tool loop, validation and telemetry layers are on; no exporter."""

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from typing import Any

import msgspec
from agent_framework import (
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FunctionInvocationLayer,
    Message,
)
from agent_framework.observability import ChatTelemetryLayer

from bench.results import Maf
from bench.timing import pct, runs_per_s
from runbus_examples import travel

INSTRUCTIONS = "You are a travel assistant."
PROMPT = "Book it."
SCRIPT: list[tuple[str, dict[str, Any]] | str] = [
    ("get_weather", {"city": "Sydney"}),
    ("search_flights", {"origin": "Melbourne", "destination": "Sydney", "date": "2026-12-08"}),
    ("create_booking", {"flight_id": "QF412-20261208"}),
    "Booked: {last_result}",
]
"""runbus's bench SCRIPT (bench/run.py) in MAF's terms."""

calls: dict[str, int] = {"get_weather": 0, "search_flights": 0, "create_booking": 0}
"""Tool calls MAF made, so the anchor is known to run the whole loop."""


# The tools: runbus's travel functions with the same arguments and results. The identity that
# runbus injects from trusted headers is fixed here; MAF has no such notion.
def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city (demo data, deterministic)."""
    calls["get_weather"] += 1
    return msgspec.to_builtins(travel.get_weather(city))  # type: ignore[no-any-return]


def search_flights(origin: str, destination: str, date: date) -> list[dict[str, Any]]:
    """Flights between two cities on a date, cheapest first (demo data, deterministic)."""
    calls["search_flights"] += 1
    return msgspec.to_builtins(travel.search_flights(origin, destination, date))  # type: ignore[no-any-return]


def create_booking(flight_id: str, seat: str = "any", cabin: str = "economy") -> dict[str, Any]:
    """Book a seat on a flight for the signed-in user."""
    calls["create_booking"] += 1
    booking = travel.Booking(
        confirmation="RB-" + flight_id[-6:],
        flight_id=flight_id,
        passenger="alice",
        tenant="acme",
        seat=seat,
        cabin=cabin,
        price_aud=travel.fare(flight_id, "business" if cabin == "business" else "economy"),
    )
    return msgspec.to_builtins(booking)  # type: ignore[no-any-return]


TOOLS: list[Callable[..., object]] = [get_weather, search_flights, create_booking]


# MAF's layers each redefine get_response; its own provider clients stack them the same way.
class ScriptedChatClient(  # type: ignore[misc]
    ChatMiddlewareLayer[Any],
    FunctionInvocationLayer[Any],
    ChatTelemetryLayer[Any],
    BaseChatClient[Any],
):
    """Reply N of a turn after N assistant messages since the last user message, like runbus's
    scripted backend; `{last_result}` becomes the last tool result. The layers are the ones
    MAF's own provider clients stack (middleware, function invocation, telemetry)."""

    OTEL_PROVIDER_NAME = "scripted"

    async def _reply(self, messages: Sequence[Message]) -> ChatResponse:
        turn: list[Message] = []
        for message in messages:
            turn = [] if message.role == "user" else [*turn, message]
        step = sum(1 for m in turn if m.role == "assistant")
        reply = SCRIPT[min(step, len(SCRIPT) - 1)]
        if isinstance(reply, str):
            results = [c for m in turn for c in m.contents if c.type == "function_result"]
            last = str(results[-1].result) if results else ""
            content = Content.from_text(reply.replace("{last_result}", last))
        else:
            name, arguments = reply
            content = Content.from_function_call(f"call-{step}", name, arguments=arguments)
        return ChatResponse(
            messages=[Message(role="assistant", contents=[content])], response_id=f"r{step}"
        )

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **_: Any
    ) -> Any:
        assert not stream, "the anchor measures whole runs, not streams"
        return self._reply(messages)


def make_agent() -> Agent[Any]:
    return Agent(ScriptedChatClient(), INSTRUCTIONS, name="bench", tools=TOOLS)


async def one_run(agent: Agent[Any]) -> str:
    response = await agent.run(PROMPT)
    text = response.text
    assert "confirmation" in text, text
    return text


def check_tools_called(runs: int) -> None:
    """Each run must have called each tool once, or the anchor measured a shorter loop."""
    expected = dict.fromkeys(calls, runs)
    assert calls == expected, f"MAF tool calls {calls}, expected {expected}"


async def measure(n: int, concurrency: tuple[int, ...] = (1, 64), trials: int = 3) -> Maf:
    """Latency p50/p99 of `n` sequential runs and CPU per run; runs/s at each concurrency,
    the median of `trials` rounds."""
    agent = make_agent()
    for _ in range(20):
        await one_run(agent)
    calls.update(dict.fromkeys(calls, 0))
    samples: list[float] = []
    cpu = time.process_time()
    for _ in range(n):
        start = time.perf_counter()
        await one_run(agent)
        samples.append(time.perf_counter() - start)
    cpu_per_run = (time.process_time() - cpu) / n
    check_tools_called(n)
    ms = [s * 1000 for s in samples]
    rates = await runs_per_s(
        lambda: one_run(agent),
        concurrency,
        lambda clients: max(n, clients * 4),
        trials,
        cpu_seconds=time.process_time,
    )
    return Maf(
        n=n,
        p50_ms=statistics.median(ms),
        p99_ms=pct(ms, 0.99),
        cpu_ms_per_run=cpu_per_run * 1000,
        tool_calls_per_run=3,
        model_calls_per_run=4,
        runs_per_s=rates.runs_per_s,
        cpu_ms_per_run_by_clients=rates.cpu_ms_per_run,
    )


if __name__ == "__main__":
    import uvloop

    print(msgspec.json.format(msgspec.json.encode(uvloop.run(measure(200))), indent=2).decode())
