"""What holding the model's text costs: time to the first text byte and to `run.completed`,
for the same answer streamed as the model writes it and held until output guardrails pass.

    .venv/bin/python -m examples.output_guardrails.measure_latency [PACE_MS]   # in the repo root

The model streams WORDS words, one every PACE_MS milliseconds (default 20: a small hosted
model's speed), on the whole stack in-process over a local nats-server (the test suite's
harness, `tests/stack.py`).
"""

import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import aclosing
from datetime import UTC, datetime
from pathlib import Path

import nats
from tests.stack import secured_nats, start_stack

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
PACE = float(sys.argv[1]) / 1000 if len(sys.argv) > 1 else 0.02
RUNS = 10
TEXT = " ".join(f"word{i}" for i in range(WORDS))


class PacedModel:
    """Writes TEXT a word at a time, PACE seconds apart, as a provider's stream would."""

    name = "paced"

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        for index, word in enumerate(TEXT.split(" ")):
            await asyncio.sleep(PACE)
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
    """Seconds from the request to its first text byte, and to `run.completed`."""
    start = time.perf_counter()
    first = None
    async with aclosing(client.stream(agent, "Say it.", session_id=session_id)) as events:
        async for event in events:
            if first is None and isinstance(event, RunTextDelta) and event.delta:
                first = time.perf_counter() - start
            if isinstance(event, RunCompleted):
                assert event.text == TEXT
                assert first is not None
                return first, time.perf_counter() - start
    raise RuntimeError("the run did not complete")


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        async with (
            secured_nats(data / "bus") as server,
            start_stack(
                server.url,
                data_dir=data,
                agents={a.name: a for a in (STREAMED, HELD)},
                routes={"paced": PacedModel()},
            ),
        ):
            nc = await nats.connect(server.url)
            client = RunbusClient(nc, token="dev-alice")
            results: dict[str, list[tuple[float, float]]] = {"streamed": [], "held": []}
            for index in range(RUNS + 1):
                for agent in results:
                    sample = await timed(client, agent, f"{agent}-{index}")
                    if index:  # the first of each warms the stack up
                        results[agent].append(sample)
            await nc.drain()
    print(f"model: {WORDS} words, one every {PACE * 1000:.0f} ms; median of {RUNS} runs")
    for agent, samples in results.items():
        first = statistics.median(s[0] for s in samples) * 1000
        done = statistics.median(s[1] for s in samples) * 1000
        print(f"{agent:>9}: first text byte {first:7.1f} ms   run.completed {done:7.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
