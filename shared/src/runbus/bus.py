"""Request and publish over NATS with the run context, trace context and deadline applied.

Every hop between services goes through `Bus.call` (a declared operation) or `Bus.request`
(a raw or forwarded body): it writes the headers, opens the client
span, caps the wait at the time the run has left, refuses a message larger than the server
takes, and turns an `rb-error` reply into a `RemoteError` with the remote code.

A progress-aware request (`progress=True`) waits on an idle timer instead of a fixed one: the
serving side sends heartbeats to the caller's progress subject while it works (`heartbeats`),
each resets the timer, and when the caller stops listening (it gave up, was cancelled or died)
the next heartbeat is answered "gone" (or finds no one at all) and the serving side cancels the
work. The replies and heartbeats of every such call of one connection come on one wildcard
subscription (`ProgressCalls`), not on one made and dropped per call.
"""

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.client import JetStreamContext
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context

from . import headers as h
from .errors import (
    CallerGone,
    DeadlineExceeded,
    IdleTimeout,
    MessageTooLarge,
    Unavailable,
    remote_error,
)
from .messages import encode
from .ops import Op
from .telemetry import inject, messaging_attributes, record_failure, start_span

T = TypeVar("T")
Req = TypeVar("Req", bound=msgspec.Struct)
Rep = TypeVar("Rep", bound=msgspec.Struct)
NO_RESPONDERS_RETRY: Final = 0.05
HEARTBEAT_EVERY: Final = 0.5
"""Seconds between heartbeats of work in progress; also how soon work whose caller is gone
is cancelled."""
MIN_IDLE: Final = 2 * HEARTBEAT_EVERY
BEAT_SILENCE: Final = 10.0
"""Seconds without a heartbeat, once one was heard, after which a progress-aware call gives
up even when its idle timeout is longer: the serving side beats every `HEARTBEAT_EVERY` from
its event loop while the work goes on (a slow provider or tool included), so twenty missed
beats mean it died, lost NATS for good or is stuck. Before the first beat (due after
`HEARTBEAT_EVERY`) only the idle timeout applies: the request may still be on its way."""
REQUEST_TIMEOUT_SETTING: Final = "RUNBUS_REQUEST_TIMEOUT"
_REPLY: Final = "r"
_BEAT: Final = "p"
_STATUS: Final = "Status"
_NO_RESPONDERS: Final = "503"
GONE: Final = {_STATUS: _NO_RESPONDERS, "rb-gone": "1"}
"""Headers of the answer to a heartbeat whose call is no longer waited on: the status the
server gives a request nobody listens to, so any NATS client, a serving side of an earlier
runbus version too, reads it as "no responders" (`rb-gone` says who sent it)."""


class ProgressCalls:
    """The progress-aware calls one connection has in flight, on one subscription.

    Call `t` gets its reply on `<prefix>.t.r` and the serving side's heartbeats on
    `<prefix>.t.p`. A per-call subscription would say "the caller left" by disappearing (the
    next beat finds no responders), but costs the server a SUB and an UNSUB, and the
    interest changes that come with them, for every call; here a beat for a call no longer
    waited on is answered with the same "no responders" status instead (`GONE`). A caller
    process that died still leaves no responders at all.
    """

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._prefix = ""
        self._waiting: dict[str, asyncio.Queue[Msg]] = {}
        self._tokens = itertools.count()
        self._opening = asyncio.Lock()

    async def open(self) -> str:
        """The subscription's subject prefix, subscribing on first use."""
        if not self._prefix:
            async with self._opening:
                if not self._prefix:
                    prefix = self.nc.new_inbox()
                    await self.nc.subscribe(f"{prefix}.*.*", cb=self._on_message)
                    self._prefix = prefix
        return self._prefix

    def token(self) -> str:
        """A call id unique on this subscription (its prefix is unique to the connection)."""
        return str(next(self._tokens))

    def wait(self, token: str) -> "asyncio.Queue[Msg]":
        """Start listening for call `token`'s reply and heartbeats."""
        queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._waiting[token] = queue
        return queue

    def done(self, token: str) -> None:
        """Stop listening for call `token`: its next heartbeat is answered `GONE`."""
        self._waiting.pop(token, None)

    async def _on_message(self, msg: Msg) -> None:
        token, _, kind = msg.subject[len(self._prefix) + 1 :].partition(".")
        queue = self._waiting.get(token)
        if queue is not None:
            queue.put_nowait(msg)
        elif kind == _BEAT and msg.reply:
            with contextlib.suppress(nats.errors.Error):
                await self.nc.publish(msg.reply, b"", headers=dict(GONE))


class Bus:
    """The NATS connection of one service or client, with its tracer."""

    def __init__(
        self,
        nc: NATS,
        tracer: Tracer,
        *,
        request_timeout: float = 30.0,
        beat_silence: float = BEAT_SILENCE,
    ) -> None:
        self.nc = nc
        self.tracer = tracer
        self.request_timeout = request_timeout
        self.beat_silence = beat_silence
        self.progress_calls = ProgressCalls(nc)

    @functools.cached_property
    def js(self) -> JetStreamContext:
        """One context for the connection's lifetime: nats-py's `publish_async` subscribes an
        ack inbox per JetStreamContext and never drops it, so a context per publish left a
        subscription behind for every run event (on the client and on the server)."""
        return self.nc.jetstream()

    async def request(
        self,
        subject: str,
        message: msgspec.Struct | msgspec.Raw,
        decoder: msgspec.json.Decoder[T],
        *,
        ctx: h.RunContext,
        span_subject: str | None = None,
        timeout: float | None = None,
        progress: bool = False,
    ) -> T:
        """Send `message`, wait for the reply and decode it; raise on an error reply.

        `span_subject` is the low-cardinality template for the span name when `subject`
        carries an id or a tool name. With `progress`, `timeout` (default: the request timeout)
        is the longest silence allowed rather than the longest wait; the run's deadline still
        bounds the whole wait.
        """
        wait = timeout or self.request_timeout
        left = ctx.time_left()
        if left is not None:
            if left <= 0:
                raise DeadlineExceeded(f"deadline passed before the request to {subject!r}")
            if not progress:
                wait = min(wait, left)
        data = encode(message)
        self.check_size(subject, data)
        # The client span is never made current: nothing runs under it but the request, and
        # the service side finds its parent through the injected traceparent.
        span = start_span(
            self.tracer,
            f"send {span_subject or subject}",
            SpanKind.CLIENT,
            messaging_attributes(subject, "send", message_size=len(data)),
        )
        try:
            headers = ctx.to_headers()
            inject(headers, set_span_in_context(span))
            if progress:
                # At least two heartbeats fit in the idle time, so one late beat is no failure.
                idle = max(wait, MIN_IDLE)
                reply = await self._request_with_progress(subject, data, idle, left, headers)
            else:
                reply = await self._request(subject, data, wait, left, headers)
            if (error := remote_error(reply.headers, reply.data)) is not None:
                raise error
            return decoder.decode(reply.data)
        except Exception as exc:
            record_failure(span, exc)
            raise
        finally:
            span.end()

    async def call(
        self,
        op: Op[Req, Rep],
        message: Req,
        *,
        ctx: h.RunContext,
        timeout: float | None = None,
        progress: bool = False,
    ) -> Rep:
        """`request` for one declared operation: its subject, span name and reply type."""
        return await self.request(
            op.subject,
            message,
            op.decode_reply,
            ctx=ctx,
            span_subject=op.span_subject,
            timeout=timeout,
            progress=progress,
        )

    def check_size(self, subject: str, data: bytes) -> None:
        """Refuse, with a typed error, a body the server would reject (`max_payload`)."""
        limit = self.nc.max_payload
        if len(data) > limit:
            raise MessageTooLarge(subject, len(data), limit)

    async def _request(
        self, subject: str, data: bytes, wait: float, left: float | None, headers: dict[str, str]
    ) -> Msg:
        try:
            try:
                return await self.nc.request(subject, data, timeout=wait, headers=headers)
            except nats.errors.NoRespondersError:
                # A replica that is just subscribing (or restarting) can be missed for a
                # moment; one short retry tells "not there yet" from "not there at all".
                await asyncio.sleep(NO_RESPONDERS_RETRY)
                return await self.nc.request(subject, data, timeout=wait, headers=headers)
        except nats.errors.NoRespondersError:
            raise Unavailable(f"no service answers on {subject!r}") from None
        except nats.errors.TimeoutError:
            if left is not None and wait >= left:
                raise DeadlineExceeded(f"deadline passed waiting on {subject!r}") from None
            raise Unavailable(f"no reply on {subject!r} within {wait:.1f}s") from None

    async def _request_with_progress(
        self, subject: str, data: bytes, idle: float, left: float | None, headers: dict[str, str]
    ) -> Msg:
        """The reply and the heartbeats come on the connection's `ProgressCalls`; leaving
        (on return, error or cancel) is what tells the serving side to stop."""
        calls = self.progress_calls
        prefix = await calls.open()
        token = calls.token()
        deadline = None if left is None else time.monotonic() + left
        headers[h.PROGRESS] = f"{prefix}.{token}.{_BEAT}"
        reply_to = f"{prefix}.{token}.{_REPLY}"
        heard = calls.wait(token)
        silence = idle  # until the serving side is heard beating (`BEAT_SILENCE`)
        try:
            for attempt in range(2):
                await self.nc.publish(subject, data, reply=reply_to, headers=headers)
                while True:
                    wait = silence
                    if deadline is not None:
                        wait = min(wait, deadline - time.monotonic())
                    try:
                        if wait <= 0:
                            raise TimeoutError
                        async with asyncio.timeout(wait):
                            msg = await heard.get()
                    except TimeoutError:
                        if deadline is not None and time.monotonic() >= deadline - 0.001:
                            raise DeadlineExceeded(
                                f"deadline passed waiting on {subject!r}"
                            ) from None
                        if silence < idle:
                            raise IdleTimeout(
                                subject, silence, REQUEST_TIMEOUT_SETTING, beats_stopped=True
                            ) from None
                        raise IdleTimeout(subject, idle, REQUEST_TIMEOUT_SETTING) from None
                    if msg.subject.endswith(f".{_BEAT}"):
                        silence = min(idle, self.beat_silence)
                        continue
                    if msg.headers and msg.headers.get(_STATUS) == _NO_RESPONDERS:
                        break
                    return msg
                if attempt == 0:
                    await asyncio.sleep(NO_RESPONDERS_RETRY)
            raise Unavailable(f"no service answers on {subject!r}")
        finally:
            calls.done(token)

    async def publish(
        self, subject: str, message: msgspec.Struct, *, ctx: h.RunContext | None = None
    ) -> None:
        """Fire-and-forget publish (run events, deltas) with the run and trace context."""
        headers = ctx.to_headers() if ctx else {}
        inject(headers)
        data = encode(message)
        self.check_size(subject, data)
        await self.nc.publish(subject, data, headers=headers)

    async def stream_publish(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        """Publish into a JetStream stream and wait for its ack."""
        self.check_size(subject, data)
        return await self.js.publish(subject, data, headers=headers)

    async def stream_publish_async(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        """Publish into a JetStream stream; the ack's future (gather many before going on)."""
        self.check_size(subject, data)
        return await self.js.publish_async(subject, data, headers=headers)


async def heartbeats(
    nc: NATS,
    progress: str,
    work: Awaitable[T],
    *,
    every: float = HEARTBEAT_EVERY,
    on_gone: Callable[[], None] | None = None,
) -> T:
    """Run `work`, beating to the caller's `progress` subject every `every` seconds meanwhile.

    A beat is a request nobody answers: it times out while the caller waits, and comes back
    at once as "no responders" once the caller stopped waiting (`GONE`) or is gone, which
    cancels `work` and raises `CallerGone`. Without a progress subject `work` simply runs.
    The first beat goes out after `every`, not at once: most work (a tool call, a scripted or
    cached model reply) is done by then, and a beat it does not need costs three processes a
    message each.
    """
    task = asyncio.ensure_future(work)
    if not progress:
        return await task
    gone = False

    async def beat() -> None:
        nonlocal gone
        await asyncio.sleep(every)
        while not task.done():
            try:
                await nc.request(progress, b"", timeout=every)
            except nats.errors.TimeoutError:
                continue  # the caller waits
            except nats.errors.NoRespondersError:
                pass  # the call ended (`GONE`), or the caller's process is gone
            except nats.errors.Error:
                await asyncio.sleep(every)  # reconnecting: the work goes on meanwhile
                continue
            # No responders, or any answer at all: nobody waits for this work any more.
            gone = True
            if on_gone is not None:
                on_gone()
            task.cancel()
            return

    beating = asyncio.ensure_future(beat())
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if gone and task.cancelled() and (current is None or current.cancelling() == 0):
            raise CallerGone(progress) from None
        raise
    finally:
        beating.cancel()
        if not task.done():
            task.cancel()
