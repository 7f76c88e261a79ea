"""A model server's health without a bus: down and back from probes and from real calls, the
backoff of the probes, the degraded report naming the URL and the setting (never a
credential), and how `runbus status` shows and counts a degraded router."""

import asyncio

import pytest
from structlog.testing import capture_logs

from runbus.commands.status import describe, exit_code, render, summarise, with_progress
from runbus.discovery import Ping, join
from runbus.progress import BACKOFF, Progress
from runbus_model_router.server_health import (
    UP_INTERVAL,
    ModelServer,
    ServerHealth,
    ServerWatch,
    problem_of,
    shown_url,
)

URL = "http://127.0.0.1:8081/v1"
LOCAL = ModelServer(url=URL, backends=("lb",), routes=("local",))
DOWN = (
    'model server http://127.0.0.1:8081/v1 (route "local", backend "lb" in RUNBUS_MODEL_ROUTES) '
    "is unreachable: connection refused"
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def router() -> Progress:
    progress = Progress("model_router")
    progress.ready()
    return progress


def watched(router: Progress, clock: Clock, server: ModelServer = LOCAL) -> ServerHealth:
    return ServerHealth(server, router, clock=clock)


def test_a_server_that_does_not_answer_makes_the_router_degraded_until_it_answers(
    router: Progress, clock: Clock
) -> None:
    health = watched(router, clock)

    with capture_logs() as logs:
        health.failed("connection refused")
        health.failed("connection refused")  # still down: said once
        degraded = router.snapshot()
        health.answered()
        health.answered()

    assert (degraded.state, degraded.reason) == ("degraded", DOWN)
    assert (router.state, router.reason) == ("ready", "")
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("dependency_down", "warning"),
        ("dependency_up", "info"),
    ]
    assert logs[0]["reason"] == DOWN
    assert logs[1]["dependency"] == URL


def test_a_server_found_up_at_start_says_nothing(router: Progress, clock: Clock) -> None:
    with capture_logs() as logs:
        watched(router, clock).answered()

    assert router.state == "ready"
    assert logs == []


def test_probes_of_a_server_that_stays_down_back_off_and_one_that_is_up_waits_long(
    router: Progress, clock: Clock
) -> None:
    health = watched(router, clock)
    assert health.due == clock.now  # the check at start is at once

    waits = []
    for _ in range(len(BACKOFF) + 2):
        health.failed("connection refused")
        waits.append(health.due - clock.now)
        clock.now = health.due

    health.answered()

    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert health.due - clock.now == UP_INTERVAL
    assert health.failures == 0


def test_a_call_that_cannot_connect_marks_the_server_down_at_once(
    router: Progress, clock: Clock
) -> None:
    health = watched(router, clock)
    health.answered()

    health.unreachable("connection refused")
    first_probe = health.due
    clock.now += 0.2
    health.unreachable("connection refused")  # more failing calls: the probes keep their pace

    assert (router.state, router.reason) == ("degraded", DOWN)
    assert first_probe == health.due == 100.5


def test_a_call_that_gets_an_answer_brings_the_server_back_and_puts_off_the_probe(
    router: Progress, clock: Clock
) -> None:
    health = watched(router, clock)
    health.failed("connection refused")
    clock.now += 3

    health.answered()

    assert router.state == "ready"
    assert health.due == clock.now + UP_INTERVAL


def test_a_call_that_times_out_only_brings_the_next_probe_forward(
    router: Progress, clock: Clock
) -> None:
    health = watched(router, clock)
    health.answered()
    woken: list[float] = []
    health.wake = lambda: woken.append(clock.now)
    clock.now += 5

    health.doubt()
    health.doubt()

    assert router.state == "ready"  # a slow model is not a dead server
    assert health.due == clock.now
    assert woken == [clock.now]


def test_a_server_down_before_the_router_is_ready_makes_it_degraded_when_it_is(
    clock: Clock,
) -> None:
    progress = Progress("model_router")
    progress.report("starting")
    watched(progress, clock).failed("connection refused")
    starting = progress.state

    progress.ready()

    assert starting == "starting"
    assert (progress.state, progress.reason) == ("degraded", DOWN)


def test_two_servers_down_are_both_named_and_the_router_is_degraded_until_both_answer(
    router: Progress, clock: Clock
) -> None:
    other = ModelServer(url="http://gpu:8000/v1", backends=("a", "b"), routes=("big", "vision"))
    local, gpu = watched(router, clock), watched(router, clock, other)

    local.failed("connection refused")
    gpu.failed("answers HTTP 503")
    both = router.reason
    local.answered()
    one = router.reason
    gpu.answered()

    assert both == (
        'model server http://127.0.0.1:8081/v1 (route "local", backend "lb" in '
        "RUNBUS_MODEL_ROUTES) is unreachable: connection refused; "
        'model server http://gpu:8000/v1 (routes "big", "vision", backends "a", "b" in '
        "RUNBUS_MODEL_ROUTES) is unreachable: answers HTTP 503"
    )
    assert one.startswith("model server http://gpu:8000/v1")
    assert router.state == "ready"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8081/v1", "http://127.0.0.1:8081/v1"),
        ("https://bob:s3cret@llm.example/v1", "https://bob:***@llm.example/v1"),
        ("https://tok3n@llm.example/v1", "https://***@llm.example/v1"),
        ("https://llm.example/v1?api-key=s3cret", "https://llm.example/v1"),
    ],
)
def test_a_shown_server_url_carries_no_credential(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_a_refused_connection_is_named_by_its_os_error() -> None:
    outer = OSError("All connection attempts failed")
    outer.__cause__ = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 8081)")

    assert problem_of(outer) == "connection refused"
    assert problem_of(TimeoutError()) == "TimeoutError"


async def test_the_watch_probes_at_start_then_again_until_the_server_answers(
    router: Progress,
) -> None:
    answers = ["connection refused", "connection refused", None]
    probed = asyncio.Event()

    async def probe() -> str | None:
        problem = answers.pop(0)
        if not answers:
            probed.set()
        return problem

    health = ServerHealth(LOCAL, router, backoff=(0.01,))
    watch = ServerWatch([(health, probe)])
    watch.start()
    try:
        await asyncio.wait_for(probed.wait(), 10)
    finally:
        await watch.stop()

    assert (health.up, router.state) == (True, "ready")


async def test_a_probe_that_raises_counts_as_down_and_the_watch_goes_on(router: Progress) -> None:
    calls = 0
    again = asyncio.Event()

    async def probe() -> str | None:
        nonlocal calls
        calls += 1
        if calls == 2:
            again.set()
        raise ValueError("bad certificate")

    health = ServerHealth(LOCAL, router, backoff=(0.01,))
    watch = ServerWatch([(health, probe)])
    watch.start()
    try:
        await asyncio.wait_for(again.wait(), 10)
    finally:
        await watch.stop()

    assert router.reason.endswith("is unreachable: bad certificate")


def test_status_shows_a_degraded_router_as_ready_with_its_reason_and_exits_zero(
    router: Progress, clock: Clock
) -> None:
    watched(router, clock).failed("connection refused")
    replicas = [
        Ping(id=f"i-{name}", name=name, version="1") for name in ("model_router", "history")
    ]
    status = with_progress(summarise("nats://x", join(replicas, [], [])), [router.snapshot()])

    table = render(status)

    assert [r.service for r in status.degraded] == ["model_router"]
    assert status.starting == []
    assert "1/1 ready, 1 degraded" in table
    assert f"model_router ({router.instance}) degraded: {DOWN}" in table
    assert describe(router.snapshot()) in table.splitlines()
    everything = [
        Ping(id=f"i-{name}", name=name, version="1") for name in {s.name for s in status.services}
    ]
    assert (
        exit_code(with_progress(summarise("nats://x", join(everything, [], [])), status.degraded))
        == 0
    )
    assert exit_code(status) == 1  # services with no replica still fail the check
