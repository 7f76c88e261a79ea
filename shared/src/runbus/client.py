"""The client SDK: publish run requests, follow their events with replay, call the
authenticated client API.

    async with runbus.connect(url, token="dev-alice") as client:
        done = await client.run("travel", "Weather in Sydney?", session_id="s1")
        async for event in client.stream("travel", "And in Perth?", session_id="s1"): ...

What `run`/`stream` send is exactly a `run.request` JSON body with `rb-auth` and `Nats-Msg-Id`,
so any NATS client can do the same by hand. Events are read from the events stream, not the
live subject: a client that starts late or reconnects replays from the start (or after a
sequence it saw) with no gap and no duplicate, then follows live.
"""

import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import TypeVar

import msgspec
import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from . import blobs, subjects
from . import headers as h
from .errors import DeadlineExceeded, RemoteError, Unavailable
from .messages import (
    ChatMessage,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunRequest,
    TextContent,
    encode,
)
from .messages.errors import ERROR_DECODER
from .messages.runs import RUN_EVENT_DECODER
from .telemetry import inject, messaging_attributes

T = TypeVar("T")
PushSubscription = JetStreamContext.PushSubscription


class RunFailedError(RemoteError):
    """The run ended with `run.failed`."""

    def __init__(self, event: RunFailed) -> None:
        super().__init__(event.error.code, event.error.message, details=event.error.details)
        self.event = event


class SequencedEvent(msgspec.Struct, frozen=True):
    """A run event with its position in the events stream (resume after `seq`)."""

    seq: int
    event: RunEvent


def new_run_id() -> str:
    return f"r-{uuid.uuid4().hex[:16]}"


class RunbusClient:
    def __init__(self, nc: NATS, *, token: str) -> None:
        self.nc = nc
        self.token = token
        self.tracer = trace.get_tracer("runbus.client")

    async def start(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str | None = None,
    ) -> str:
        """Publish a run request and return its run id (without waiting for it)."""
        run_id = run_id or new_run_id()
        messages = (
            [ChatMessage(role="user", contents=[TextContent(text=message)])]
            if isinstance(message, str)
            else message
        )
        # A large image or file is stored once in the object store and sent by reference.
        messages = await blobs.offload(self.nc, messages)
        request = RunRequest(run_id=run_id, agent=agent, session_id=session_id, input=messages)
        data = encode(request)
        subject = subjects.runs(agent)
        with self.tracer.start_as_current_span(
            f"send {subjects.RUNS_TEMPLATE}",
            kind=SpanKind.PRODUCER,
            attributes=messaging_attributes(subject, "send", message_size=len(data)),
        ):
            headers = {h.AUTH: f"Bearer {self.token}", h.MSG_ID: run_id}
            inject(headers)
            try:
                await self.nc.jetstream().publish(subject, data, headers=headers)
            except nats.errors.NoRespondersError:
                raise Unavailable(
                    "no run queue on this NATS: is the gateway running (`runbus up`)?"
                ) from None
        return run_id

    async def start_traced(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str | None = None,
    ) -> tuple[str, str]:
        """Like `start`, and also return the run's trace id (32 hex digits, as Jaeger shows it).

        Inside a span the run joins that trace. Otherwise it gets a trace of its own, rooted
        in a span made here; without a tracer provider in this process the client still
        picks the trace id and sends it as the run's parent, so the id is known either way.
        """
        parent = trace.get_current_span()
        owned = not parent.get_span_context().is_valid
        if owned:
            parent = self.tracer.start_span(f"run {agent}", kind=SpanKind.CLIENT)
        if not parent.get_span_context().is_valid:
            parent = trace.NonRecordingSpan(
                trace.SpanContext(
                    trace_id=uuid.uuid4().int,
                    span_id=uuid.uuid4().int >> 64,
                    is_remote=False,
                    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
                )
            )
        try:
            with trace.use_span(parent, end_on_exit=False):
                run_id = await self.start(agent, message, session_id=session_id, run_id=run_id)
        finally:
            if owned:
                parent.end()
        return run_id, trace.format_trace_id(parent.get_span_context().trace_id)

    async def follow(
        self, run_id: str, *, after: int = 0, timeout: float = 300.0
    ) -> AsyncGenerator[SequencedEvent, None]:
        """Every event of `run_id` after stream sequence `after`, then live, until the final
        one. Safe to call before the run starts, after it ended, or again after a disconnect."""
        subscription = await self._subscribe(run_id, after)
        async with aclosing(self._events(run_id, subscription, timeout)) as events:
            async for item in events:
                yield item

    async def stream(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str | None = None,
        timeout: float = 300.0,
    ) -> AsyncGenerator[RunEvent, None]:
        """Start a run and yield its events until `run.completed` or `run.failed`."""
        run_id = run_id or new_run_id()
        # The consumer exists before the request is published: nothing can be missed.
        subscription = await self._subscribe(run_id, 0)
        try:
            await self.start(agent, message, session_id=session_id, run_id=run_id)
        except BaseException:
            await subscription.unsubscribe()
            raise
        async with aclosing(self._events(run_id, subscription, timeout)) as events:
            async for item in events:
                yield item.event

    async def _subscribe(self, run_id: str, after: int) -> PushSubscription:
        if after:
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1
            )
            return await self.nc.jetstream().subscribe(
                subjects.events(run_id),
                stream=subjects.EVENTS_STREAM,
                ordered_consumer=True,
                config=config,
            )
        return await self.nc.jetstream().subscribe(
            subjects.events(run_id),
            stream=subjects.EVENTS_STREAM,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )

    @staticmethod
    async def _events(
        run_id: str, subscription: PushSubscription, timeout: float
    ) -> AsyncGenerator[SequencedEvent, None]:
        try:
            while True:
                try:
                    msg = await subscription.next_msg(timeout=timeout)
                except nats.errors.TimeoutError:
                    raise Unavailable(f"no event from run {run_id} for {timeout:.0f}s") from None
                event = RUN_EVENT_DECODER.decode(msg.data)
                yield SequencedEvent(seq=msg.metadata.sequence.stream, event=event)
                if isinstance(event, RunCompleted | RunFailed):
                    return
        finally:
            await subscription.unsubscribe()

    async def run(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str | None = None,
        timeout: float = 300.0,
    ) -> RunCompleted:
        """Run to the end and return `run.completed`; raise `RunFailedError` on `run.failed`."""
        events = self.stream(agent, message, session_id=session_id, run_id=run_id, timeout=timeout)
        async with aclosing(events):
            async for event in events:
                if isinstance(event, RunCompleted):
                    return event
                if isinstance(event, RunFailed):
                    raise RunFailedError(event)
        raise Unavailable("the event stream ended without a final event")

    async def call(
        self,
        op: str,
        message: msgspec.Struct,
        decoder: msgspec.json.Decoder[T],
        *,
        timeout: float = 30.0,
    ) -> T:
        """An authenticated client-API operation (`sessions.list`, `runs.cancel`, …)."""
        try:
            reply = await self.nc.request(
                subjects.api(op),
                encode(message),
                timeout=timeout,
                headers={h.AUTH: f"Bearer {self.token}"},
            )
        except nats.errors.NoRespondersError:
            raise Unavailable(f"no gateway answers {op!r}: is runbus up?") from None
        except nats.errors.TimeoutError:
            raise DeadlineExceeded(f"no reply to {op!r} within {timeout:.0f}s") from None
        if reply.headers and h.ERROR in reply.headers:
            info = ERROR_DECODER.decode(reply.data).error
            raise RemoteError(info.code, info.message, details=info.details)
        return decoder.decode(reply.data)


@asynccontextmanager
async def connect(url: str, *, token: str) -> AsyncIterator[RunbusClient]:
    """A client on its own connection, drained on exit."""
    nc = await nats.connect(url)
    try:
        yield RunbusClient(nc, token=token)
    finally:
        await nc.drain()
