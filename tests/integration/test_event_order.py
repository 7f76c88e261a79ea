"""A run's final event is its last stored event even when an earlier event's ack was lost (a
node restarting): that event is published again before the final one, never after it."""

import asyncio

import pytest
from nats.aio.client import Client as NATS
from nats.js.api import PubAck, StreamConfig
from opentelemetry import trace

from runbus import subjects
from runbus.bus import Bus
from runbus.headers import RunContext
from runbus.jetstream import ensure_stream
from runbus.messages import FunctionResultContent, RunCompleted, Usage
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus_gateway.event_stream import EventStream
from runbus_gateway.run.events import RunEvents

CTX = RunContext(run_id="r1", session_id="s1", props={"tenant": "acme", "user_id": "alice"})


class LosingFirstResult(Bus):
    """Never sends the first tool result, and its ack never comes (lost with a node)."""

    lost = False

    async def stream_publish_async(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        if b"run.tool_result" in data and not self.lost:
            self.lost = True
            return asyncio.get_running_loop().create_future()
        return await super().stream_publish_async(subject, data, headers)


@pytest.fixture
async def events_stream(nc: NATS) -> None:
    await ensure_stream(
        nc, StreamConfig(name=subjects.EVENTS_STREAM, subjects=[subjects.EVENTS_ALL])
    )


async def test_an_event_whose_ack_was_lost_is_stored_before_the_final_event(
    nc: NATS, events_stream: None
) -> None:
    bus = LosingFirstResult(nc, trace.get_tracer("test"), request_timeout=0.5)
    stream = EventStream(bus)
    events = RunEvents(stream, CTX)

    await events.started("travel")
    await events.tool_results([FunctionResultContent(call_id="c1", result="18°C")])
    await events.completed(RunCompleted(run_id="r1", response=[], text="done", usage=Usage()))
    await stream.settle(CTX)
    stored = await nc.jetstream().get_last_msg(
        subjects.EVENTS_STREAM, subjects.events("acme", "alice", "r1")
    )
    info = await nc.jetstream().stream_info(subjects.EVENTS_STREAM)

    assert bus.lost
    assert isinstance(RUN_EVENT_DECODER.decode(stored.data or b""), RunCompleted)
    assert info.state.messages == 3
