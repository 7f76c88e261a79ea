"""Run cost against session length: runs 1…N of one session (the 3-tool run, 8 messages a run)
for an agent with a sliding-window compaction policy, with the stored history compacted
(`persist = true`: later runs load from the latest compaction) and without (each run loads the
whole session and ships it through the compaction hop). Sessions of both kinds advance in
lockstep, run i of every session back to back, so the machine's noise falls on both alike."""

import statistics

from bench.processes import process_stack
from bench.results import SessionLength, SessionVariant
from bench.whole_run import Clients, warm

WINDOW_TURNS = 4
POLICY = f"""
[compaction]
strategy = "sliding_window"
trigger = {{condition = "turns_exceed", turns = {WINDOW_TURNS}}}
"""
AGENT = """
name = "{name}"
instructions = "You are a travel assistant."
model = "scripted/bench"
tools = ["get_weather", "search_flights", "create_booking"]
[memory]
enabled = false
"""
AGENTS = {
    "windowed": AGENT.format(name="windowed") + POLICY,
    "persisted": AGENT.format(name="persisted") + POLICY + "persist = true\n",
}
EDGE = 5
"""Runs at each end of the session whose median is compared (first 5 against last 5)."""


async def measure(runs: int = 100, rounds: int = 3) -> SessionLength:
    print(
        f"\n[session length] runs 1…{runs} of one session, {rounds} session(s) per variant, "
        f"sliding window of {WINDOW_TURNS} turns"
    )
    samples: dict[str, list[list[float]]] = {name: [[] for _ in range(runs)] for name in AGENTS}
    async with process_stack(agents=AGENTS) as stack:
        clients = await Clients.open(stack.url)
        try:
            await warm(clients)
            for index in range(runs):
                for name in AGENTS:
                    for round_ in range(rounds):
                        elapsed = await clients.one(name, session_id=f"{name}-{round_}")
                        samples[name][index].append(elapsed * 1000)
        finally:
            await clients.close()
    variants: dict[str, SessionVariant] = {}
    for name, by_run in samples.items():
        first = statistics.median(s for run in by_run[:EDGE] for s in run)
        last = statistics.median(s for run in by_run[-EDGE:] for s in run)
        variants[name] = SessionVariant(
            run_ms=[statistics.median(run) for run in by_run],
            first_ms=first,
            last_ms=last,
            last_over_first=last / first,
        )
        print(
            f"  {name:<10} runs 1-{EDGE}: {first:6.1f} ms   runs {runs - EDGE + 1}-{runs}: "
            f"{last:6.1f} ms   ratio {last / first:.2f}x"
        )
    return SessionLength(
        runs=runs,
        rounds=rounds,
        window_turns=WINDOW_TURNS,
        windowed=variants.get("windowed"),
        persisted=variants.get("persisted"),
    )
