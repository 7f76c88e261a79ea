"""Fixtures of the integration tests that several modules share."""

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client as NATS

from runbus_history.service import HistoryService


@pytest.fixture
async def history(nc: NATS) -> AsyncIterator[HistoryService]:
    """A history service on the test's connection."""
    service = HistoryService(nc)
    await service.start()
    yield service
    await service.stop()
