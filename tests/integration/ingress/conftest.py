"""The ingress on a free port against the test stack, an HTTP client for it, and a bus client of
alice's for comparing what HTTP shows with what the bus holds."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import msgspec
import nats
import pytest
from opentelemetry.trace import TracerProvider

from runbus.client import RunbusClient
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_ingress.connections import UserConnections
from runbus_ingress.server import listening
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, Stack, start_stack

ALICE = {"Authorization": "Bearer dev-alice"}
BOB = {"Authorization": "Bearer dev-bob"}
GATED_AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}
"""The travel agent on the `gated` route, whose model a test holds and releases."""


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


@asynccontextmanager
async def one_slot_taken(
    nats_server: SecuredNats, data_dir: Path, alice: RunbusClient
) -> AsyncIterator[GatedModel]:
    """The whole stack with a single run slot, taken by a run of alice's held at its first
    model call (session `busy`); whatever is started next waits in the queue until the test
    sets `release`, which leaving does too."""
    model = GatedModel(weather_then_answer, hold={0})
    async with start_stack(
        nats_server.url,
        data_dir=data_dir,
        agents=GATED_AGENTS,
        routes={"gated": model},
        gateway_options={"run_concurrency": 1},
    ):
        await alice.start("travel", "Hi", session_id="busy")
        await asyncio.wait_for(model.reached.wait(), 20)
        try:
            yield model
        finally:
            model.release.set()


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
