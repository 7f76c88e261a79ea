"""Fixtures of the integration tests that several modules share."""

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client as NATS

from runbus.client import RunbusClient
from runbus_history.service import HistoryService
from tests.stack import SecuredNats


@pytest.fixture
async def history(nc: NATS) -> AsyncIterator[HistoryService]:
    """A history service on the test's connection."""
    service = HistoryService(nc)
    await service.start()
    yield service
    await service.stop()


@pytest.fixture
async def users(nats_server: SecuredNats) -> AsyncIterator[dict[str, RunbusClient]]:
    """alice, bob (her tenant) and carol (another tenant), each on a connection of their own
    token: the attacker tests' valid credentials of another user and of another tenant."""
    clients = {
        name: RunbusClient(await nats.connect(nats_server.url), token=f"dev-{name}")
        for name in ("alice", "bob", "carol")
    }
    yield clients
    for client in clients.values():
        await client.nc.drain()
