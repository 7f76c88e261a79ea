"""Fixtures shared by every test layer: a real nats-server per test, secured as in production
(its auth callout answered in-process), the six services in-process with one in-memory span
exporter, and a plain nats-py client with the service credential."""

from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.stack import SecuredNats, Stack, secured_nats, start_stack

TESTS = Path(__file__).parent
LANES = ("chaos", "e2e")
"""Directories whose every test carries the marker of the same name."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        lane = item.path.relative_to(TESTS).parts[0]
        if lane in LANES:
            item.add_marker(lane)


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[SecuredNats]:
    """A fresh secured nats-server with JetStream on a random loopback port."""
    async with secured_nats(tmp_path / "bus") as server:
        yield server


@pytest.fixture
async def nc(nats_server: SecuredNats) -> AsyncIterator[NATS]:
    client = await nats.connect(nats_server.url)
    yield client
    await client.drain()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def stack(
    nats_server: SecuredNats, spans: InMemorySpanExporter, tmp_path: Path
) -> AsyncIterator[Stack]:
    """The six services in-process on their own connections, each with its own tracer
    provider (so spans carry the right service.name) exporting to `spans`."""
    async with start_stack(
        nats_server.url, data_dir=tmp_path / "data", processor=SimpleSpanProcessor(spans)
    ) as running:
        yield running
