"""A run's events into the events stream: each published without waiting for its ack, the acks
awaited before a step's calls run and before the run request is acked (`settle`), an
unconfirmed event published again under its own `Nats-Msg-Id`; and the checkpoints a resumed
run reads back from them (`checkpointed`)."""

import asyncio
import contextlib
from collections import defaultdict
from typing import NamedTuple

import msgspec
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck
from nats.js.errors import NotFoundError

from runbus import subjects
from runbus.bus import Bus
from runbus.errors import Unavailable
from runbus.headers import MSG_ID, RunContext
from runbus.messages import ChatMessage, RunEvent, RunStarted, RunToolCall, encode
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus.owners import Owner
from runbus.telemetry import inject

CHECKPOINT_FETCH = 256
"""Events a resumed run reads back per fetch."""


class EventStream:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._unsettled: dict[str, list[_Published]] = defaultdict(list)
        """Events published and not yet confirmed, by owner's run (`Owner.key(run_id)`)."""

    async def emit(self, ctx: RunContext, event: RunEvent, *, event_id: str) -> None:
        """Publish a run event into the events stream without waiting for its ack.

        `Nats-Msg-Id` = `<tenant>.<user_id>.<run_id>:<event_id>`, so a resumed run that emits
        an event again is stored once, and no other owner's event can be taken for it;
        `settle()` waits for the acks before the run request is acked.
        """
        run = Owner.of(ctx).key(ctx.run_id)
        headers = ctx.to_headers()
        headers[MSG_ID] = f"{run}:{event_id}"
        inject(headers)
        subject = subjects.events(ctx.prop("tenant"), ctx.prop("user_id"), ctx.run_id)
        data = encode(event)
        ack = await self.bus.stream_publish_async(subject, data, headers)
        self._unsettled[run].append(_Published(subject, data, headers, ack))

    async def settle(self, ctx: RunContext) -> dict[str, int]:
        """Wait until every event of the run is stored in the events stream; the answer maps
        the `Nats-Msg-Id` of each one the stream already held to its stored sequence.

        An ack lost with a NATS node never resolves, so the wait is bounded; what is still
        unconfirmed then is published once more under its own `Nats-Msg-Id` (the stream keeps
        one copy) and waited on. Only if that fails too is the run `Unavailable`: delivered
        again, it publishes its events under the same ids.
        """
        published = self._unsettled.pop(Owner.of(ctx).key(ctx.run_id), [])
        if not published:
            return {}
        limit = self.bus.request_timeout
        _, lost = await asyncio.wait([p.ack for p in published], timeout=limit)
        for ack in lost:
            ack.cancel()  # never resolves now: nobody is left to wait on it
        unconfirmed = [p for p in published if not _stored(p.ack)]
        duplicates = {
            p.headers[MSG_ID]: p.ack.result().seq
            for p in published
            if _stored(p.ack) and p.ack.result().duplicate
        }
        if not unconfirmed:
            return duplicates
        try:
            async with asyncio.timeout(limit):
                for p in unconfirmed:
                    stored = await self.bus.stream_publish(p.subject, p.data, p.headers)
                    if stored.duplicate:
                        duplicates[p.headers[MSG_ID]] = stored.seq
        except (TimeoutError, nats.errors.Error) as exc:
            raise Unavailable(
                f"the events stream did not confirm {len(unconfirmed)} event(s) of run "
                f"{ctx.run_id!r} within {2 * limit:.0f}s ({type(exc).__name__})"
            ) from None
        return duplicates

    async def checkpointed(self, ctx: RunContext) -> list[ChatMessage]:
        """The messages the run's stored events carry as checkpoints (`RunToolCall.checkpoint`),
        in order, each id once: what a redelivered run produced before. Read from the run's
        own subject, which names its owner; a run whose last event is its start has none."""
        subject = subjects.events(ctx.prop("tenant"), ctx.prop("user_id"), ctx.run_id)
        js = self.bus.nc.jetstream()
        try:
            last = await js.get_last_msg(subjects.EVENTS_STREAM, subject, direct=True)
        except NotFoundError:
            return []
        if isinstance(_decoded(last.data), RunStarted):
            return []
        messages: dict[str, ChatMessage] = {}
        # One ephemeral consumer reads them all (the model's deltas too, many for a long reply).
        reader = await js.pull_subscribe(
            subject,
            stream=subjects.EVENTS_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
        try:
            while True:
                batch = await reader.fetch(CHECKPOINT_FETCH, timeout=self.bus.request_timeout)
                for msg in batch:
                    event = _decoded(msg.data)
                    if isinstance(event, RunToolCall):
                        for message in event.checkpoint:
                            messages.setdefault(message.message_id, message)
                if not batch or batch[-1].metadata.num_pending == 0:
                    return list(messages.values())
        finally:
            with contextlib.suppress(nats.errors.Error):
                await reader.unsubscribe()


def _decoded(data: bytes | None) -> object:
    """A stored message of a run's subject as its event; None for one today's types do not
    know."""
    with contextlib.suppress(msgspec.DecodeError):
        return RUN_EVENT_DECODER.decode(data or b"")
    return None


class _Published(NamedTuple):
    """An event sent to the stream whose ack `settle` has yet to see."""

    subject: str
    data: bytes
    headers: dict[str, str]
    ack: asyncio.Future[PubAck]


def _stored(ack: asyncio.Future[PubAck]) -> bool:
    """The stream confirmed it (not cancelled, not failed)."""
    return not ack.cancelled() and ack.exception() is None
