"""A run waits for its events to be stored before its request is acked, but not for ever: an
ack the stream never sends (lost in a NATS outage) makes the run `unavailable`, so it is
delivered again instead of being held in progress indefinitely."""

import asyncio
from typing import cast

import pytest
from nats.aio.client import Client as NATS
from nats.js.api import PubAck
from opentelemetry import trace

from runbus.bus import Bus
from runbus.errors import Unavailable
from runbus.headers import RunContext
from runbus.messages import RunStarted
from runbus_gateway.approvals import Approvals
from runbus_gateway.ports import BusPorts

STARTED = RunStarted(run_id="r-1", session_id="s1", agent="travel")
CTX = RunContext(run_id="r-1", session_id="s1", props={"tenant": "acme", "user_id": "alice"})


class StreamThatNeverAcks(Bus):
    def __init__(self) -> None:
        super().__init__(cast(NATS, None), trace.get_tracer("test"), request_timeout=0.2)
        self.pending: list[asyncio.Future[PubAck]] = []

    async def stream_publish_async(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        self.pending.append(asyncio.get_running_loop().create_future())
        return self.pending[-1]


async def test_events_the_stream_never_acknowledges_fail_the_run_as_unavailable() -> None:
    bus = StreamThatNeverAcks()
    ports = BusPorts(bus, cast(Approvals, None))  # emit and settle need no approvals
    await ports.emit(CTX, STARTED, event_id="started")

    with pytest.raises(Unavailable, match="did not confirm 1 event"):
        await ports.settle(CTX)

    assert [ack.cancelled() for ack in bus.pending] == [True]


async def test_events_the_stream_acknowledges_settle_at_once() -> None:
    bus = StreamThatNeverAcks()
    ports = BusPorts(bus, cast(Approvals, None))  # emit and settle need no approvals
    await ports.emit(CTX, STARTED, event_id="started")
    bus.pending[0].set_result(PubAck(stream="RUNBUS_EVENTS", seq=1))

    await ports.settle(CTX)
