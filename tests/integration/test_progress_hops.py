"""Progress-aware hops over a real nats-server: the wait follows the serving side's heartbeats,
silence fails with an error naming the setting, and work whose caller left is cancelled."""

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import nats
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from opentelemetry.trace import NoOpTracer

from runbus.bus import Bus, heartbeats
from runbus.errors import IdleTimeout, MessageTooLarge
from runbus.headers import RunContext
from runbus.messages import TextContent
from tests.helpers import eventually, take_time
from tests.stack import SecuredNats

CONTENT_DECODER = msgspec.json.Decoder(TextContent)
REPLY = TextContent(text="done")
SUBJECT = "test.progress"


async def serve(nc: NATS, work: Callable[[], Awaitable[None]]) -> None:
    """A replica that answers after `work`, beating to the caller meanwhile."""

    async def on_request(msg: Msg) -> None:
        ctx = RunContext.from_headers(msg.headers)
        await heartbeats(nc, ctx.progress, work())
        await msg.respond(msgspec.json.encode(REPLY))

    await nc.subscribe(SUBJECT, cb=on_request)
    await nc.flush()


async def test_work_longer_than_the_timeout_finishes_while_it_beats(nc: NATS) -> None:
    async def slow() -> None:
        await take_time(2.2)  # the work itself, longer than any idle timeout allows

    await serve(nc, slow)
    bus = Bus(nc, NoOpTracer(), request_timeout=0.3)
    reply = await bus.request(SUBJECT, REPLY, CONTENT_DECODER, ctx=RunContext(), progress=True)
    assert reply == REPLY


async def test_silence_fails_with_an_error_naming_the_setting(nc: NATS) -> None:
    """A replica that took the request and then says nothing (stalled, or died after it)."""

    async def take_and_say_nothing(msg: Msg) -> None:
        pass

    await nc.subscribe("test.silent", cb=take_and_say_nothing)
    bus = Bus(nc, NoOpTracer(), request_timeout=0.3)
    with pytest.raises(IdleTimeout) as caught:
        await bus.request("test.silent", REPLY, CONTENT_DECODER, ctx=RunContext(), progress=True)
    assert "RUNBUS_REQUEST_TIMEOUT" in str(caught.value)
    assert caught.value.code == "unavailable"


async def test_a_replica_that_stops_beating_fails_the_call_before_the_idle_timeout(
    nc: NATS, nats_server: SecuredNats
) -> None:
    """It was heard beating, then died mid-work (its connection closed without a reply): the
    call fails once the beats have stopped for the beat silence, not after the whole idle
    timeout, with an error saying the replica stopped."""
    replica = await nats.connect(nats_server.url)
    progress: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_request(msg: Msg) -> None:
        progress.set_result(RunContext.from_headers(msg.headers).progress)
        await heartbeats(replica, progress.result(), asyncio.Event().wait(), every=0.05)

    await replica.subscribe("test.dies", cb=on_request)
    await replica.flush()
    beats: list[Msg] = []

    async def heard(msg: Msg) -> None:
        beats.append(msg)

    bus = Bus(nc, NoOpTracer(), request_timeout=30, beat_silence=1.0)
    call = asyncio.ensure_future(
        bus.request("test.dies", REPLY, CONTENT_DECODER, ctx=RunContext(), progress=True)
    )
    await nc.subscribe(await asyncio.wait_for(progress, 10), cb=heard)
    await eventually(lambda: len(beats) >= 2, what="the replica beating")
    await replica.close()  # dies mid-work

    with pytest.raises(IdleTimeout) as caught:
        await asyncio.wait_for(call, 10)  # far less than the 30 s idle timeout
    assert "stopped sending heartbeats 1s ago" in str(caught.value)
    assert caught.value.details["beats_stopped"] is True
    assert caught.value.code == "unavailable"


async def test_work_is_cancelled_when_its_caller_stops_waiting(nc: NATS) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def endless() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    await serve(nc, endless)
    bus = Bus(nc, NoOpTracer(), request_timeout=5)
    call = asyncio.ensure_future(
        bus.request(SUBJECT, REPLY, CONTENT_DECODER, ctx=RunContext(), progress=True)
    )
    await asyncio.wait_for(started.wait(), 5)
    call.cancel()
    await asyncio.wait_for(cancelled.wait(), 2)


async def test_a_message_over_the_server_limit_is_refused_before_it_is_sent(nc: NATS) -> None:
    bus = Bus(nc, NoOpTracer())
    huge = TextContent(text="x" * (nc.max_payload + 1))
    with pytest.raises(MessageTooLarge) as caught:
        await bus.request(SUBJECT, huge, CONTENT_DECODER, ctx=RunContext())
    assert caught.value.limit == nc.max_payload
    assert caught.value.code == "message_too_large"
    with pytest.raises(MessageTooLarge):
        await bus.publish(SUBJECT, huge)


async def test_work_done_before_the_first_beat_is_due_sends_no_beat(nc: NATS) -> None:
    """A quick reply costs no heartbeat: the first one is due only after HEARTBEAT_EVERY."""
    progress = nc.new_inbox()
    sub = await nc.subscribe(progress)
    await nc.flush()

    async def quick() -> str:
        await nc.flush()  # work that takes a round trip to the server, like a fast tool call
        return "done"

    assert await heartbeats(nc, progress, quick(), every=30.0) == "done"
    await nc.flush()  # a beat sent would be in the subscription's queue by the server's pong
    assert sub.pending_msgs == 0


async def test_work_past_the_first_beat_beats_until_it_ends(nc: NATS) -> None:
    """A beat comes once `every` has passed; with a listener it only times out, and the work's
    result is returned (the beats a caller's idle timer is reset by)."""
    beats: list[Msg] = []
    beaten = asyncio.get_running_loop().create_future()
    progress = nc.new_inbox()

    async def on_beat(msg: Msg) -> None:
        beats.append(msg)
        if not beaten.done():
            beaten.set_result(None)

    await nc.subscribe(progress, cb=on_beat)
    await nc.flush()

    async def until_beaten() -> str:
        await beaten
        return "done"

    assert await heartbeats(nc, progress, until_beaten(), every=0.05) == "done"
    assert len(beats) >= 1


async def test_a_beat_for_a_call_that_returned_is_answered_no_responders(nc: NATS) -> None:
    """The caller's connection keeps one subscription for all its progress calls, so a call
    that ended is not told by the server's "no responders" but by an answer that reads the
    same to any NATS client (a serving side of an earlier version too): the work stops."""
    progress_subjects: list[str] = []

    async def on_request(msg: Msg) -> None:
        progress_subjects.append(RunContext.from_headers(msg.headers).progress)
        await msg.respond(msgspec.json.encode(REPLY))

    await nc.subscribe(SUBJECT, cb=on_request)
    bus = Bus(nc, NoOpTracer(), request_timeout=5)
    for _ in range(2):
        await bus.request(SUBJECT, REPLY, CONTENT_DECODER, ctx=RunContext(), progress=True)

    first, second = progress_subjects
    assert first != second
    with pytest.raises(nats.errors.NoRespondersError):
        await nc.request(first, b"", timeout=5)
