"""The ingress on a free port against the test stack, an HTTP client for it, and a bus client of
alice's for comparing what HTTP shows with what the bus holds."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import nats
import pytest
from opentelemetry.trace import TracerProvider

from runbus.client import RunbusClient
from runbus_ingress.connections import UserConnections
from runbus_ingress.server import listening
from tests.stack import SecuredNats, Stack

ALICE = {"Authorization": "Bearer dev-alice"}
BOB = {"Authorization": "Bearer dev-bob"}


@asynccontextmanager
async def ingress(
    url: str,
    *,
    keepalive: float = 15.0,
    connections: UserConnections | None = None,
    jaeger_url: str = "",
    tracer_provider: TracerProvider | None = None,
) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """The ingress on a free port (each user on their own bus connection) and an HTTP client."""
    async with (
        listening(
            url,
            "127.0.0.1",
            0,
            keepalive=keepalive,
            connections=connections,
            jaeger_url=jaeger_url,
            tracer_provider=tracer_provider,
        ) as base,
        aiohttp.ClientSession(base, timeout=aiohttp.ClientTimeout(total=30)) as http,
    ):
        yield base, http


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    """Alice on a connection with the service credential: the tests also read the events
    stream directly, to compare what the ingress sent with what is stored."""
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


@pytest.fixture
async def served(stack: Stack, nats_server: SecuredNats) -> AsyncIterator[str]:
    """Base URL of an ingress in front of the whole stack."""
    async with listening(nats_server.client_url, "127.0.0.1", 0) as base:
        yield base


@pytest.fixture
async def http(served: str) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(served, timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
