"""Timing helpers every benchmark section shares."""

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple


def pct(samples: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `samples`, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    """Seconds each of `n` sequential awaits of `call()` took."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


class LevelRates(NamedTuple):
    """Runs/s and CPU per run at each level of clients, keyed by the level as a string."""

    runs_per_s: dict[str, float]
    cpu_ms_per_run: dict[str, float]
    """Every round of the level together; empty without a CPU reading."""


async def runs_per_s(
    call: Callable[[], Awaitable[object]],
    levels: Iterable[int],
    total: Callable[[int], int],
    trials: int,
    cpu_seconds: Callable[[], float] | None = None,
) -> LevelRates:
    """Runs/s at each level of clients (`total(clients)` awaits of `call()`, at most `clients`
    at once), the median of `trials` rounds; with `cpu_seconds` (the CPU the system under
    test has used so far), also its CPU per run at each level: the cost of a run where
    requests overlap, which is not the cost of a run alone."""
    rates = LevelRates({}, {})
    for clients in levels:
        runs = total(clients)
        limit = asyncio.Semaphore(clients)

        async def guarded(limit: asyncio.Semaphore = limit) -> None:
            async with limit:
                await call()

        rounds = []
        cpu = cpu_seconds() if cpu_seconds else 0.0
        for _ in range(trials):
            start = time.perf_counter()
            await asyncio.gather(*(guarded() for _ in range(runs)))
            rounds.append(runs / (time.perf_counter() - start))
        rates.runs_per_s[str(clients)] = statistics.median(rounds)
        if cpu_seconds:
            rates.cpu_ms_per_run[str(clients)] = (cpu_seconds() - cpu) * 1000 / (runs * trials)
    return rates


def points_per_level(level: int) -> int:
    """Runs measured at a level: 15 at 1 (a run's overhead there is a few ms beside a 1.2 s
    run, and 5 left its p50 moving by 10 % from one bench run to the next), two waves at 64,
    one wave above."""
    return 15 if level == 1 else level if level >= 256 else level * 2


async def in_flight_round(
    call: Callable[[], Awaitable[float]],
    level: int,
    total: int,
    failure: Callable[[Exception], str],
) -> tuple[list[float], list[str], float]:
    """`total` awaits of `call()` (each returns its own seconds), at most `level` at once: the
    seconds of those that succeeded, `failure(exc)` of those that raised, and the round's
    seconds. A failure is counted, not fatal: failures are a result here."""
    limit = asyncio.Semaphore(level)
    samples: list[float] = []
    failures: list[str] = []

    async def guarded() -> None:
        async with limit:
            try:
                samples.append(await call())
            except Exception as exc:
                failures.append(failure(exc))

    start = time.perf_counter()
    await asyncio.gather(*(guarded() for _ in range(total)))
    return samples, failures, time.perf_counter() - start
