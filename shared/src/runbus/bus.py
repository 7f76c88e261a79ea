"""Request and publish over NATS with the run context, trace context and deadline applied.

Every hop between services goes through `Bus.request`: it writes the headers, opens the client
span, caps the wait at the time the run has left and turns an `rb-error` reply into a
`RemoteError` with the remote code.
"""

import asyncio
from typing import Final, TypeVar

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import PubAck
from opentelemetry.trace import SpanKind, Tracer, set_span_in_context

from . import headers as h
from .errors import DeadlineExceeded, RemoteError, Unavailable
from .messages import encode
from .messages.errors import ERROR_DECODER
from .telemetry import inject, messaging_attributes, record_failure, start_span

T = TypeVar("T")
NO_RESPONDERS_RETRY: Final = 0.05


class Bus:
    """The NATS connection of one service or client, with its tracer."""

    def __init__(self, nc: NATS, tracer: Tracer, *, request_timeout: float = 30.0) -> None:
        self.nc = nc
        self.tracer = tracer
        self.request_timeout = request_timeout

    async def request(
        self,
        subject: str,
        message: msgspec.Struct | msgspec.Raw,
        decoder: msgspec.json.Decoder[T],
        *,
        ctx: h.RunContext,
        span_subject: str | None = None,
        timeout: float | None = None,
    ) -> T:
        """Send `message`, wait for the reply and decode it; raise on an error reply.

        `span_subject` is the low-cardinality template for the span name when `subject`
        carries an id or a tool name.
        """
        wait = timeout or self.request_timeout
        left = ctx.time_left()
        if left is not None:
            if left <= 0:
                raise DeadlineExceeded(f"deadline passed before the request to {subject!r}")
            wait = min(wait, left)
        data = encode(message)
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
            reply = await self._request(subject, data, wait, left, headers)
            if reply.headers and h.ERROR in reply.headers:
                info = ERROR_DECODER.decode(reply.data).error
                raise RemoteError(info.code, info.message, details=info.details)
            return decoder.decode(reply.data)
        except Exception as exc:
            record_failure(span, exc)
            raise
        finally:
            span.end()

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

    async def publish(
        self, subject: str, message: msgspec.Struct, *, ctx: h.RunContext | None = None
    ) -> None:
        """Fire-and-forget publish (run events, deltas) with the run and trace context."""
        headers = ctx.to_headers() if ctx else {}
        inject(headers)
        await self.nc.publish(subject, encode(message), headers=headers)

    async def stream_publish(self, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        """Publish into a JetStream stream and wait for its ack."""
        return await self.nc.jetstream().publish(subject, data, headers=headers)

    async def stream_publish_async(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        """Publish into a JetStream stream; the ack's future (gather many before going on)."""
        return await self.nc.jetstream().publish_async(subject, data, headers=headers)
