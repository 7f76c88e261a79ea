"""A run waits for its events to be stored before its request is acked, but not for ever: an
ack the stream never sends (lost with a NATS node) has the event published once more under its
own `Nats-Msg-Id`; if the stream does not confirm that either, the run is `unavailable`, so it
is delivered again instead of being held in progress indefinitely."""

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
        self.republished: list[tuple[str, dict[str, str]]] = []
        self.stored_on_republish = False

    async def stream_publish_async(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        self.pending.append(asyncio.get_running_loop().create_future())
        return self.pending[-1]

    async def stream_publish(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        self.republished.append((subject, headers))
        if not self.stored_on_republish:
            await asyncio.get_running_loop().create_future()  # never acked either
        return PubAck(stream="RUNBUS_EVENTS", seq=2)


async def test_events_the_stream_never_acknowledges_fail_the_run_as_unavailable() -> None:
    bus = StreamThatNeverAcks()
    ports = BusPorts(bus, cast(Approvals, None))  # emit and settle need no approvals
    await ports.emit(CTX, STARTED, event_id="started")

    with pytest.raises(Unavailable, match="did not confirm 1 event"):
        await ports.settle(CTX)

    assert [ack.cancelled() for ack in bus.pending] == [True]
    assert len(bus.republished) == 1


async def test_an_event_whose_ack_was_lost_is_published_again_under_the_same_id() -> None:
    bus = StreamThatNeverAcks()
    bus.stored_on_republish = True
    ports = BusPorts(bus, cast(Approvals, None))
    await ports.emit(CTX, STARTED, event_id="started")
    await ports.emit(CTX, STARTED, event_id="again")
    bus.pending[1].set_result(PubAck(stream="RUNBUS_EVENTS", seq=1))

    await ports.settle(CTX)  # no Unavailable: the run is not retried for a lost ack

    assert [headers["Nats-Msg-Id"] for _, headers in bus.republished] == ["acme.alice.r-1:started"]


async def test_events_the_stream_acknowledges_settle_at_once() -> None:
    bus = StreamThatNeverAcks()
    ports = BusPorts(bus, cast(Approvals, None))  # emit and settle need no approvals
    await ports.emit(CTX, STARTED, event_id="started")
    bus.pending[0].set_result(PubAck(stream="RUNBUS_EVENTS", seq=1))

    await ports.settle(CTX)

    assert bus.republished == []
