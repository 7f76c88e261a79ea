"""What holding the model's text costs: time to the first text byte and to `run.completed`,
for the same answer streamed as the model writes it and held until output guardrails pass
(the two agents' runs interleaved, the whole stack in this process over a local nats-server)."""

import asyncio
import statistics
import tempfile
import time
from contextlib import aclosing
from datetime import UTC, datetime
from pathlib import Path

import nats
from tests.stack import secured_nats, start_stack

from bench.results import HeldDeltas, SectionNumbers
from runbus.client import RunbusClient
from runbus.messages import (
    ChatMessage,
    ModelRequest,
    ModelResponse,
    RunCompleted,
    RunTextDelta,
    TextContent,
    Usage,
)
from runbus_gateway.agents import AgentSpec, OutputPolicy
from runbus_model_router.backends import OnDelta

WORDS = 60
PACE_S = 0.02
"""Seconds between the model's words: a small hosted model's speed."""
RUNS = 10
TEXT = " ".join(f"word{i}" for i in range(WORDS))


class PacedModel:
    """Writes TEXT a word at a time, `pace_s` seconds apart, as a provider's stream would."""

    name = "paced"

    def __init__(self, pace_s: float) -> None:
        self.pace_s = pace_s

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        for index, word in enumerate(TEXT.split(" ")):
            await asyncio.sleep(self.pace_s)
            await on_delta(word if index == 0 else f" {word}")
        message = ChatMessage(
            role="assistant", contents=[TextContent(text=TEXT)], created_at=datetime.now(UTC)
        )
        return ModelResponse(message=message, model="paced", finish_reason="stop", usage=Usage())


STREAMED = AgentSpec(name="streamed", model="paced")
HELD = AgentSpec(
    name="held",
    model="paced",
    output=OutputPolicy(guardrails=[{"name": "blocked_terms", "terms": ["launch codes"]}]),
)


async def timed(client: RunbusClient, agent: str, session_id: str) -> tuple[float, float]:
    """Milliseconds from the request to its first text byte, and to `run.completed`."""
    start = time.perf_counter()
    first = None
    async with aclosing(client.stream(agent, "Say it.", session_id=session_id)) as events:
        async for event in events:
            if first is None and isinstance(event, RunTextDelta) and event.delta:
                first = (time.perf_counter() - start) * 1000
            if isinstance(event, RunCompleted):
                assert event.text == TEXT
                assert first is not None
                return first, (time.perf_counter() - start) * 1000
    raise RuntimeError("the run did not complete")


async def measure(runs: int = RUNS, pace_s: float = PACE_S) -> HeldDeltas:
    """The median of `runs` runs of each agent, after one warm-up run each."""
    samples: dict[str, list[tuple[float, float]]] = {"streamed": [], "held": []}
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        async with (
            secured_nats(data / "bus") as server,
            start_stack(
                server.url,
                data_dir=data,
                agents={a.name: a for a in (STREAMED, HELD)},
                routes={"paced": PacedModel(pace_s)},
            ),
        ):
            nc = await nats.connect(server.url)
            client = RunbusClient(nc, token="dev-alice")
            try:
                for index in range(runs + 1):
                    for agent, kept in samples.items():
                        sample = await timed(client, agent, f"{agent}-{index}")
                        if index:
                            kept.append(sample)
            finally:
                await nc.drain()

    def median(agent: str, which: int) -> float:
        return statistics.median(s[which] for s in samples[agent])

    return HeldDeltas(
        words=WORDS,
        pace_ms=pace_s * 1000,
        runs=runs,
        streamed_first_ms=median("streamed", 0),
        streamed_completed_ms=median("streamed", 1),
        held_first_ms=median("held", 0),
        held_completed_ms=median("held", 1),
    )


async def run_benchmark(runs: int = RUNS) -> SectionNumbers:
    print(
        f"\n[held deltas] output guardrails hold the text until they pass; {WORDS} words, "
        f"one every {PACE_S * 1000:.0f} ms; median of {runs} runs of each, interleaved"
    )
    result = await measure(runs)
    for agent, first, done in (
        ("streamed", result.streamed_first_ms, result.streamed_completed_ms),
        ("held", result.held_first_ms, result.held_completed_ms),
    ):
        print(f"  {agent:>9}: first text byte {first:7.1f} ms   run.completed {done:7.1f} ms")
    return SectionNumbers(held_deltas=result)
