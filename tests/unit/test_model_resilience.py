"""Per-target protection: the circuit breaker's states, the token bucket's pace, the cap."""

# mypy narrows `breaker.state` (a property) after the first comparison and then calls the
# next one, after the breaker changed, unreachable.
# mypy: disable-error-code="comparison-overlap, unreachable"

import asyncio
import time

from runbus_model_router.resilience import CircuitBreaker, TargetGuard, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_after_the_configured_consecutive_failures() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=3, cooldown=10, clock=clock)

    for _ in range(2):
        assert breaker.try_acquire()
        breaker.record_failure()
    assert breaker.state == "closed"
    assert breaker.try_acquire()
    breaker.record_failure()

    assert breaker.state == "open"
    assert not breaker.try_acquire()


def test_a_success_resets_the_count_of_consecutive_failures() -> None:
    breaker = CircuitBreaker(failures=2, cooldown=10, clock=Clock())

    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()

    assert breaker.state == "closed"


def test_after_the_cooldown_one_probe_goes_through_and_its_success_closes_the_circuit() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown=10, clock=clock)
    breaker.record_failure()

    clock.now += 9.9
    assert not breaker.try_acquire()
    clock.now += 0.1
    assert breaker.state == "half_open"
    assert breaker.try_acquire()
    assert not breaker.try_acquire(), "only one probe at a time"
    breaker.record_success()

    assert breaker.state == "closed"
    assert breaker.try_acquire()


def test_a_failed_probe_opens_the_circuit_for_another_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=5, cooldown=10, clock=clock)
    for _ in range(5):
        breaker.record_failure()
    clock.now += 10
    assert breaker.try_acquire()

    breaker.record_failure()

    assert breaker.state == "open"
    clock.now += 9
    assert not breaker.try_acquire()


def test_a_probe_that_ends_without_a_verdict_lets_the_next_call_probe() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failures=1, cooldown=1, clock=clock)
    breaker.record_failure()
    clock.now += 1
    assert breaker.try_acquire()

    breaker.release()

    assert breaker.try_acquire()


async def test_the_token_bucket_lets_a_full_burst_through_without_waiting() -> None:
    frozen = Clock()  # time never passes: any wait for a refill would never end
    bucket = TokenBucket(rate=1.0, capacity=3, clock=frozen)

    await asyncio.wait_for(asyncio.gather(*(bucket.take() for _ in range(3))), 1)

    assert bucket.tokens == 0


async def test_past_the_burst_the_token_bucket_paces_calls_at_its_rate() -> None:
    bucket = TokenBucket(rate=50.0, capacity=1)
    await bucket.take()
    started = time.perf_counter()

    for _ in range(3):
        await bucket.take()

    assert time.perf_counter() - started >= 3 / 50 - 0.002


async def test_the_token_bucket_grants_a_request_bigger_than_the_bucket_once_it_is_full() -> None:
    bucket = TokenBucket(rate=1000.0, capacity=10)

    await asyncio.wait_for(bucket.take(50), 1)

    assert bucket.tokens < 1


async def test_the_guard_never_lets_more_than_its_cap_in_at_once() -> None:
    guard = TargetGuard(
        concurrency=3,
        requests_per_second=None,
        burst=None,
        tokens_per_second=None,
        breaker=CircuitBreaker(5, 1),
    )
    highest = 0

    async def call() -> None:
        nonlocal highest
        async with guard.slot(10):
            highest = max(highest, guard.in_flight)
            await asyncio.sleep(0)  # let the other calls try for a slot while this one holds it

    await asyncio.gather(*(call() for _ in range(20)))

    assert highest == 3
    assert guard.in_flight == 0
