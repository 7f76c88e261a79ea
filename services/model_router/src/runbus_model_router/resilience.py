"""Per-target protection, per replica: a concurrency cap, token buckets and a circuit breaker.

A burst of calls waits its turn here instead of reaching the provider as a storm of 429s, and a
target that keeps failing is skipped until its cool-down has passed.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal, assert_never

Clock = Callable[[], float]

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Closed → open after `failures` consecutive failures → after `cooldown` one probe call is
    let through (half-open): its success closes the circuit, its failure opens it again."""

    def __init__(self, failures: int, cooldown: float, clock: Clock = time.monotonic) -> None:
        self.threshold = failures
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        if self.probing or self.clock() - self.opened_at >= self.cooldown:
            return "half_open"
        return "open"

    def try_acquire(self) -> bool:
        """May a call go to the target now? In half-open, only the one probe may."""
        match self.state:
            case "closed":
                return True
            case "half_open" if not self.probing:
                self.probing = True
                return True
            case "half_open" | "open":
                return False
            case _:
                assert_never(self.state)

    def release(self) -> None:
        """The call ended without saying anything about the target (cancelled, bad request)."""
        self.probing = False

    def record_success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def record_failure(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self.probing = False


class TokenBucket:
    """`rate` tokens per second up to `capacity`; `take(n)` waits until n are there."""

    def __init__(self, rate: float, capacity: float, clock: Clock = time.monotonic) -> None:
        self.rate = rate
        self.capacity = capacity
        self.clock = clock
        self.tokens = capacity
        self.updated = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    async def take(self, amount: float = 1.0) -> None:
        # More than the bucket holds could never be granted; asking for it all is the cap.
        amount = min(amount, self.capacity)
        async with self._lock:  # first come, first served
            self._refill()
            while self.tokens < amount:
                await asyncio.sleep((amount - self.tokens) / self.rate)
                self._refill()
            self.tokens -= amount


class TargetGuard:
    """Everything that stands between a call and one target."""

    def __init__(
        self,
        *,
        concurrency: int | None,
        requests_per_second: float | None,
        burst: int | None,
        tokens_per_second: float | None,
        breaker: CircuitBreaker,
    ) -> None:
        self.slots = asyncio.Semaphore(concurrency) if concurrency else None
        self.requests = (
            TokenBucket(requests_per_second, burst or max(1.0, requests_per_second))
            if requests_per_second
            else None
        )
        self.tokens = (
            TokenBucket(tokens_per_second, tokens_per_second * 60) if tokens_per_second else None
        )
        self.breaker = breaker
        self.in_flight = 0

    @asynccontextmanager
    async def slot(self, tokens: int) -> AsyncIterator[None]:
        """Wait for a concurrency slot, then for the rate limits; hold the slot while inside."""
        if self.slots is not None:
            await self.slots.acquire()
        try:
            if self.requests is not None:
                await self.requests.take()
            if self.tokens is not None:
                await self.tokens.take(tokens)
            self.in_flight += 1
            try:
                yield
            finally:
                self.in_flight -= 1
        finally:
            if self.slots is not None:
                self.slots.release()
