"""A session of 1,000 turns of 3 KB (no compaction in the agent file) on a bus with NATS's
default 1 MiB max payload: every run completes, and a run's latency at the last turns is
compared with turn 10 (the median of each). The services run in this process; history's
default window keeps what a run loads bounded, in a saw-tooth between half the window and the
window."""

import statistics
import tempfile
import time
from pathlib import Path

import nats
from tests.stack import start_stack

from bench.processes import OPEN_BUS_ALICE
from bench.results import LongSession, SectionNumbers
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats
from runbus_examples.scripted import ScriptedReply
from runbus_gateway.agents import AgentSpec

TURNS = 1000
HALF_TURN = 1500
"""Bytes of a question and of an answer: 3 KB turns, as in the issue's measurement."""
EARLY_TURN = 10
LATE = 50
"""The last turns compared with turn 10: more than one period of the window's saw-tooth. Each
is run right after the 10th turn of a session of its own, so the machine's noise falls on
both alike."""
TOKEN = "dev-alice"


async def run_benchmark(turns: int = TURNS) -> SectionNumbers:
    agent = AgentSpec(name="long", instructions="You answer at length.", model="scripted/long")
    answer = ScriptedReply(text="a" * HALF_TURN)
    print(f"\n[long session] {turns} turns of {2 * HALF_TURN} B, one session, no compaction")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        async with start_stack(
            server.url,
            data_dir=Path(tmp),
            agents={"long": agent},
            scripts={"long": [answer]},
        ):
            nc = await nats.connect(server.url)
            client = RunbusClient(nc, token=TOKEN, identity=OPEN_BUS_ALICE)

            async def turn(session_id: str, number: int) -> float:
                question = f"question {number:04d} " + "q" * HALF_TURN
                start = time.perf_counter()
                await client.run("long", question, session_id=session_id)
                return (time.perf_counter() - start) * 1000

            try:
                # Sessions that will be at their 10th turn when the long one is at its last.
                for index in range(LATE):
                    for number in range(EARLY_TURN - 1):
                        await turn(f"short-{index}", number)
                run_ms = [await turn("long", number) for number in range(turns - LATE)]
                early, late = [], []
                for index in range(LATE):
                    early.append(await turn(f"short-{index}", EARLY_TURN - 1))
                    late.append(await turn("long", turns - LATE + index))
                run_ms.extend(late)
                limit = nc.max_payload
            finally:
                await nc.drain()
    result = LongSession(
        turns=turns,
        turn_bytes=2 * HALF_TURN,
        max_payload=limit,
        early_ms=statistics.median(early),
        late_ms=statistics.median(late),
        late_over_early=statistics.median(late) / statistics.median(early),
        late_max_ms=max(late),
        run_ms=run_ms,
    )
    print(
        f"  max payload {limit:,} B; session {turns * 2 * HALF_TURN / 1e6:.1f} MB stored; "
        f"{turns} runs, every one completed\n"
        f"  turn {EARLY_TURN}: {result.early_ms:6.1f} ms   turns {turns - LATE + 1}-{turns}: "
        f"{result.late_ms:6.1f} ms (median; max {result.late_max_ms:.1f} ms)   "
        f"ratio {result.late_over_early:.2f}x (target <= 1.5x)"
    )
    return SectionNumbers(long_session=result)
