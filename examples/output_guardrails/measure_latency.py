"""What holding the model's text costs: time to the first text byte and to `run.completed`,
for the same answer streamed as the model writes it and held until output guardrails pass.
The measuring code is bench/held_deltas.py (a section of `make bench`).

    .venv/bin/python -m examples.output_guardrails.measure_latency [PACE_MS]   # in the repo root
"""

import asyncio
import sys

from bench.held_deltas import PACE_S, RUNS, measure


async def main() -> None:
    pace_s = float(sys.argv[1]) / 1000 if len(sys.argv) > 1 else PACE_S
    result = await measure(RUNS, pace_s)
    print(
        f"model: {result.words} words, one every {result.pace_ms:.0f} ms; "
        f"median of {result.runs} runs"
    )
    for agent, first, done in (
        ("streamed", result.streamed_first_ms, result.streamed_completed_ms),
        ("held", result.held_first_ms, result.held_completed_ms),
    ):
        print(f"{agent:>9}: first text byte {first:7.1f} ms   run.completed {done:7.1f} ms")


if __name__ == "__main__":
    asyncio.run(main())
