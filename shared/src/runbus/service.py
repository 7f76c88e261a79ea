"""The base of every request/reply service: `nats.micro` endpoints in a queue group named after
the service, a span and log context per request, and typed error replies that keep it serving.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service as MicroService
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider

from . import __version__
from . import headers as h
from .bus import Bus
from .errors import BadRequest, DeadlineExceeded, InternalError, RunbusError, Unavailable
from .instance import instance_metadata
from .messages import ErrorReply, encode
from .ops import Op, api_op
from .telemetry import extract, messaging_attributes, start_span

Handler = Callable[[h.RunContext, Any], Awaitable[msgspec.Struct | msgspec.Raw]]
Req = TypeVar("Req", bound=msgspec.Struct)
Rep = TypeVar("Rep", bound=msgspec.Struct)
RAW_DECODER: msgspec.json.Decoder[msgspec.Raw] = msgspec.json.Decoder(msgspec.Raw)


@dataclass(frozen=True)
class Endpoint:
    """One request/reply endpoint: where it listens, how its body decodes, who handles it."""

    name: str
    """Endpoint name shown by `nats micro info` (letters, digits, `-`, `_`)."""
    subject: str
    """Subject it answers on."""
    decoder: msgspec.json.Decoder[Any]
    """Decoder of the request body."""
    handler: Handler
    """Thin handler: (run context, decoded body) → reply Struct."""
    span_subject: str | None = None
    """Template for the span name when `subject` carries a name or an id."""
    op: Op[Any, Any] | None = None
    """The operation it serves (every service endpoint has one)."""
    forwarded: bool = False
    """Takes the body of `op` unread and forwards it (the gateway's client API)."""

    @classmethod
    def for_op(
        cls, op: Op[Req, Rep], handler: Callable[[h.RunContext, Req], Awaitable[Rep]]
    ) -> "Endpoint":
        """The endpoint answering `op`: its subject, name, decoder and span name come from it,
        and the handler's request and reply types must match it."""
        return cls(op.name, op.subject, op.decode, handler, op.span_subject, op)

    @classmethod
    def forwarder(
        cls,
        op: Op[Any, Any],
        handler: Callable[[h.RunContext, msgspec.Raw], Awaitable[msgspec.Raw]],
    ) -> "Endpoint":
        """The client API endpoint of a service operation: it answers on the operation's API
        subject and hands the raw body to `handler`, which forwards it to `op`."""
        api = api_op(op)
        return cls(api.name, api.subject, RAW_DECODER, handler, api.span_subject, op, True)


@dataclass(frozen=True)
class ServiceOptions:
    """What every service takes besides its own settings."""

    tracer_provider: TracerProvider | None = None
    """Where its spans go (else the global provider)."""
    max_concurrency: int = 256
    """Requests handled at once by this replica."""
    request_timeout: float = 30.0
    """Longest wait of a hop this service makes."""


DEFAULT_OPTIONS = ServiceOptions()


def as_runbus_error(exc: BaseException) -> RunbusError:
    """The typed error a failure becomes at a handler boundary."""
    match exc:
        case RunbusError():
            return exc
        case msgspec.ValidationError():
            return BadRequest(f"invalid request body: {exc}")
        case msgspec.DecodeError():
            return BadRequest(f"request body is not valid JSON: {exc}")
        case nats.errors.TimeoutError():
            # NATS or JetStream did not answer in time (e.g. during a leader election): worth
            # another try, unlike the run's own deadline passing.
            return Unavailable("NATS did not answer in time")
        case TimeoutError():
            return DeadlineExceeded("the run's deadline passed while handling the request")
        case _:
            return InternalError(f"internal error ({type(exc).__name__}); see the service log")


class Service:
    """Base of the six services. Subclasses set `name` and return their `endpoints()`."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    def __init__(self, nc: NATS, *, options: ServiceOptions = DEFAULT_OPTIONS) -> None:
        provider = options.tracer_provider or trace.get_tracer_provider()
        self.nc = nc
        self.options = options
        self.tracer = provider.get_tracer(f"runbus.{self.name}", __version__)
        self.bus = Bus(nc, self.tracer, request_timeout=options.request_timeout)
        self.log = structlog.get_logger().bind(service=self.name)
        self._slots = asyncio.Semaphore(options.max_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._micro: MicroService | None = None

    def endpoints(self) -> list[Endpoint]:
        return []

    async def on_start(self) -> None:
        """Open stores, create streams: runs before the first endpoint listens."""

    async def on_draining(self) -> None:
        """Stop taking work that is not a request (e.g. a queue consumer): runs after the
        endpoints stopped listening, before in-flight work is awaited."""

    async def on_stop(self) -> None:
        """Close what `on_start` opened: runs after the last request finished."""

    async def start(self) -> None:
        await self.on_start()
        self._micro = await add_service(
            self.nc,
            name=self.name,
            version=__version__,
            description=self.description,
            queue_group=self.name,
            metadata=instance_metadata(),
        )
        for endpoint in self.endpoints():
            await self._micro.add_endpoint(
                name=endpoint.name, subject=endpoint.subject, handler=self._dispatcher(endpoint)
            )
        # nats-py may write a flush's PING ahead of SUBs still buffered; a second round trip
        # makes sure the server has every endpoint before start() returns.
        await self.nc.flush()
        await self.nc.flush()
        self.log.info("service_started", endpoints=[e.subject for e in self.endpoints()])

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish, then close."""
        if self._micro is not None:
            # A closed connection has no subscriptions left to stop.
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await self._micro.stop()
            self._micro = None
        await self.on_draining()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.on_stop()
        self.log.info("service_stopped")

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        """Run `coro` in the background, keeping a reference until it is done."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _dispatcher(self, endpoint: Endpoint) -> Callable[[Request], Awaitable[None]]:
        span_name = f"process {endpoint.span_subject or endpoint.subject}"

        # nats-py runs one subscription's callbacks one after another; a task per request
        # lets a slow request not block the next, and the semaphore bounds how many run.
        async def dispatch(request: Request) -> None:
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(self._serve(endpoint, span_name, request))
            self._tasks.add(task)
            task.add_done_callback(self._request_done)

        return dispatch

    def _request_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _serve(self, endpoint: Endpoint, span_name: str, request: Request) -> None:
        headers = request.headers
        ctx = h.RunContext.from_headers(headers)
        span = start_span(
            self.tracer,
            span_name,
            SpanKind.SERVER,
            messaging_attributes(request.subject, "process", message_size=len(request.data)),
            context=extract(headers),
        )
        # Made current by hand (not `start_as_current_span`): the per-request cost of the
        # context-manager layers shows on every hop.
        span_token = otel_context.attach(trace.set_span_in_context(span))
        log_tokens = structlog.contextvars.bind_contextvars(run_id=ctx.run_id)
        try:
            try:
                body = endpoint.decoder.decode(request.data)
                left = ctx.time_left()
                if left is None:
                    reply = await endpoint.handler(ctx, body)
                else:
                    if left <= 0:
                        raise DeadlineExceeded(
                            "the run's deadline passed before the request arrived"
                        )
                    async with asyncio.timeout(left):
                        reply = await endpoint.handler(ctx, body)
                data, reply_headers = encode(reply), None
            except Exception as exc:
                error = as_runbus_error(exc)
                info = error.to_info()  # a forwarded error's code is the remote one
                span.set_status(Status(StatusCode.ERROR, error.message))
                span.set_attribute("error.type", info.code)
                if isinstance(error, InternalError):
                    self.log.exception("request_failed", subject=request.subject)
                else:
                    self.log.info(
                        "request_rejected",
                        subject=request.subject,
                        code=info.code,
                        reason=error.message,
                    )
                data = encode(ErrorReply(error=info))
                reply_headers = {h.ERROR: info.code}
            try:
                await request.respond(data, headers=reply_headers)
            except ValueError:
                self.log.info("request_without_reply_subject", subject=request.subject)
        finally:
            structlog.contextvars.reset_contextvars(**log_tokens)
            otel_context.detach(span_token)
            span.end()
