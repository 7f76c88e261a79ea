"""Start-up progress and dependency retries without a bus: steps, waiting reasons, backoff,
the lazy embedder, and what a command may print of a NATS URL."""

import asyncio
import os
from collections.abc import Iterator

import pytest

from runbus import progress
from runbus.progress import Progress, retrying
from runbus.runner import redact_url
from runbus_memory.embedder import HashingEmbedder, LazyEmbedder
from runbus_memory.errors import VectorSizeMismatch


@pytest.fixture
def reporter() -> Iterator[Progress]:
    installed = Progress("memory")
    before = progress.current()
    progress.install(installed)
    yield installed
    progress.install(before)


async def test_a_dependency_that_is_down_is_reported_as_waiting_then_retried(
    reporter: Progress,
) -> None:
    seen: list[tuple[str, str, int]] = []
    failures = [ConnectionRefusedError("refused"), ConnectionRefusedError("refused")]

    async def call() -> str:
        seen.append((reporter.state, reporter.reason, reporter.attempt))
        if failures:
            raise failures.pop()
        return "opened"

    result = await retrying(
        "opening the memory store",
        call,
        down=lambda exc: f"Qdrant at http://q:6333 (RUNBUS_QDRANT_URL): {exc}",
        backoff=(0.0,),
    )

    assert result == "opened"
    reason = "Qdrant at http://q:6333 (RUNBUS_QDRANT_URL): refused"
    assert seen == [("starting", "", 0), ("waiting", reason, 1), ("waiting", reason, 2)]
    assert (reporter.state, reporter.step, reporter.attempt) == (
        "starting",
        "opening the memory store",
        0,
    )


async def test_a_failure_that_waiting_will_not_cure_is_raised_at_once(reporter: Progress) -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise VectorSizeMismatch("runbus_memories", 768, 384)

    with pytest.raises(VectorSizeMismatch):
        await retrying("opening the memory store", call, down=lambda exc: None, backoff=(0.0,))
    assert calls == 1
    assert reporter.state == "starting"


def test_a_progress_report_names_the_service_its_step_and_what_it_waits_on() -> None:
    reporter = Progress("memory")
    reporter.waiting("opening the memory store", "Qdrant at http://q:6333 down", 3)

    report = reporter.snapshot()

    assert (report.service, report.state, report.step, report.attempt) == (
        "memory",
        "waiting",
        "opening the memory store",
        3,
    )
    assert report.reason == "Qdrant at http://q:6333 down"
    assert report.instance.endswith(f":{os.getpid()}")


async def test_the_lazy_embedder_loads_its_model_once_at_first_use() -> None:
    loads = 0

    async def load() -> HashingEmbedder:
        nonlocal loads
        loads += 1
        return HashingEmbedder(384)

    embedder = LazyEmbedder("hashing", 384, load)
    before = (embedder.loaded, embedder.dimension, loads)

    first, second = await asyncio.gather(embedder.embed(["a seat"]), embedder.embed(["a seat"]))

    assert before == (False, 384, 0)
    assert (embedder.loaded, loads) == (True, 1)
    assert first == second == await HashingEmbedder(384).embed(["a seat"])


async def test_a_lazy_embedder_whose_model_has_another_size_is_refused() -> None:
    async def load() -> HashingEmbedder:
        return HashingEmbedder(128)

    with pytest.raises(VectorSizeMismatch):
        await LazyEmbedder("hashing", 384, load).embed(["x"])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://gateway:s3cret@127.0.0.1:4222", "nats://gateway:***@127.0.0.1:4222"),
        ("nats://tok3n@n1:4222,nats://u:p@n2:4222", "nats://***@n1:4222,nats://u:***@n2:4222"),
    ],
)
def test_a_printed_nats_url_carries_no_password_or_token(url: str, shown: str) -> None:
    assert redact_url(url) == shown
