"""Kill matrix: for each service (the gateway included), two replicas as OS processes, one
SIGKILLed at random moments of a load of runs and started again as a supervisor would; every
run must complete once, nothing repeated, nothing lost."""

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest

from tests.chaos.conftest import ChaosReport, chaos_size
from tests.chaos.processes import (
    ChaosStack,
    Load,
    chaos_stack,
    count,
    disrupt_at,
    kill_points,
    settled,
    where,
)

KILLED = ("gateway", "history", "memory", "compaction", "model_router", "tool_executor")
RUNS = chaos_size(8, 100)
IN_FLIGHT = chaos_size(4, 8)
SETTLE = 60.0
"""Seconds the run queue gets to empty after the last final event (a lost ack costs the
gateway's 30 s ack wait)."""
KILLS = chaos_size(1, 5)
LOAD_TIMEOUT = chaos_size(120.0, 900.0)


@pytest.fixture(scope="module")
async def chaos(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ChaosStack]:
    """One stack for the whole matrix, two replicas of every service: each case kills one
    service's replicas and counts only its own runs."""
    replicas = dict.fromkeys(KILLED, 2)
    async with chaos_stack(tmp_path_factory.mktemp("kill-matrix"), replicas=replicas) as running:
        yield running


@pytest.mark.parametrize("service", KILLED)
async def test_sigkill_of_a_replica_mid_load_loses_and_repeats_nothing(
    service: str, chaos: ChaosStack, chaos_report: ChaosReport
) -> None:
    load = Load(chaos, prefix=f"k-{service}", runs=RUNS, in_flight=IN_FLIGHT)
    points = kill_points(RUNS, KILLS)
    killed: list[str] = []

    async def kill_and_restart() -> None:
        label = random.choice([service, f"{service}#2"])
        killed.append(label)
        await chaos.stack.kill(label)
        await chaos.stack.restart(label)

    started = time.monotonic()
    kills = asyncio.create_task(disrupt_at(load, points, kill_and_restart))
    await load.run(timeout=LOAD_TIMEOUT)
    in_flight = await kills
    counts = await count(chaos, load.run_ids, unsettled=await settled(chaos, SETTLE))

    chaos_report.record(
        "Kill matrix",
        {
            "service": service,
            "SIGKILLs": len(killed),
            "at run # (in flight)": where(points, in_flight),
            **counts.row(),
            "wall s": round(time.monotonic() - started, 1),
        },
    )
    assert counts.problems() == dict.fromkeys(counts.problems(), 0), counts
