"""Timing helpers every benchmark section shares."""

import time
from collections.abc import Awaitable, Callable


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
