"""The base of every request/reply service: `nats.micro` endpoints in a queue group named after
the service, a span and log context per request, typed error replies that keep it serving, and
`$SRV.STATS` measured on the path that does the work.
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.micro.request import Request
from nats.micro.service import Service as MicroService
from nats.micro.service import ServiceConfig, ServiceStats
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider

from . import __version__, subjects
from . import headers as h
from .bus import Bus
from .decoding import decode_untrusted
from .discovery import ANSWERED_DATA, GROUP_METADATA
from .errors import DeadlineExceeded
from .failures import as_runbus_error, handle_failure
from .instance import instance_metadata
from .messages import ErrorReply, encode
from .ops import Op, api_op
from .telemetry import extract, messaging_attributes, start_span

__all__ = [
    "API_GROUP",
    "DEFAULT_OPTIONS",
    "Endpoint",
    "Service",
    "ServiceOptions",
    "as_runbus_error",
]

Handler = Callable[[h.RunContext, Any], Awaitable[msgspec.Struct | msgspec.Raw]]
Req = TypeVar("Req", bound=msgspec.Struct)
Rep = TypeVar("Rep", bound=msgspec.Struct)
RAW_DECODER: msgspec.json.Decoder[msgspec.Raw] = msgspec.json.Decoder(msgspec.Raw)
API_GROUP: Final = subjects.API_ALL.removesuffix(".>")
"""The micro group of the client API endpoints (`runbus.api`): the gateway's own operations
and the ones it forwards."""


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
    group: str | None = None
    """The micro group it belongs to (its subject starts with the group's)."""

    @classmethod
    def for_op(
        cls, op: Op[Req, Rep], handler: Callable[[h.RunContext, Req], Awaitable[Rep]]
    ) -> "Endpoint":
        """The endpoint answering `op`: its subject, name, decoder and span name come from it,
        and the handler's request and reply types must match it. A client API operation's
        endpoint is in the API group."""
        group = API_GROUP if op.span_subject == subjects.API_TEMPLATE else None
        return cls(op.name, op.subject, op.decode, handler, op.span_subject, op, group=group)

    @classmethod
    def forwarder(
        cls,
        op: Op[Any, Any],
        handler: Callable[[h.RunContext, msgspec.Raw], Awaitable[msgspec.Raw]],
    ) -> "Endpoint":
        """The client API endpoint of a service operation: it answers on the operation's API
        subject and hands the raw body to `handler`, which forwards it to `op`."""
        api = api_op(op)
        return cls(
            api.name, api.subject, RAW_DECODER, handler, api.span_subject, op, True, API_GROUP
        )


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


RawHandler = Callable[[Request], Awaitable[str | None]]
"""Answers a request itself and returns the error it answered with (None when it served)."""


class _Tally:
    """One endpoint's `$SRV.STATS` numbers, counted where the work is done: a request when it
    arrives (as nats.micro does), its processing time from then (including any wait for a
    free slot) to its reply being sent, an error when that reply is an error reply."""

    __slots__ = ("answered", "errors", "last_error", "processing_ns", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.answered = 0
        self.errors = 0
        self.processing_ns = 0
        self.last_error = ""

    def arrived(self) -> int:
        self.requests += 1
        return time.perf_counter_ns()

    def answer(self, arrived_ns: int, error: str | None) -> None:
        self.answered += 1
        self.processing_ns += time.perf_counter_ns() - arrived_ns
        if error is not None:
            self.errors += 1
            self.last_error = error


class _MicroService(MicroService):
    """nats.micro's service reporting the tallies of the requests' own tasks: micro times its
    callback, which returns as soon as the request has a task, and counts an error only when
    the callback raises, never when an error reply is sent."""

    def __init__(self, nc: NATS, config: ServiceConfig, tallies: dict[str, _Tally]) -> None:
        super().__init__(nc, config)
        self._tallies = tallies

    def stats(self) -> ServiceStats:
        stats = super().stats()
        for endpoint in stats.endpoints:
            tally = self._tallies.get(endpoint.subject)
            if tally is None:
                continue
            endpoint.num_requests = tally.requests
            endpoint.num_errors = tally.errors
            endpoint.last_error = tally.last_error
            endpoint.processing_time = tally.processing_ns
            endpoint.average_processing_time = (
                tally.processing_ns // tally.answered if tally.answered else 0
            )
            # Requests count on arrival; the average is over the answered ones only.
            endpoint.data = {ANSWERED_DATA: tally.answered}
        return stats


class Service:
    """Base of the services. Subclasses set `name` and return their `endpoints()`."""

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
        self._tallies: dict[str, _Tally] = {}
        self._micro: MicroService | None = None

    def endpoints(self) -> list[Endpoint]:
        return []

    async def on_start(self) -> None:
        """Open stores, create streams: runs before the first endpoint listens."""

    async def on_listening(self) -> None:
        """Add endpoints that are not `endpoints()` (e.g. with `listen_raw`): runs once the
        service answers `$SRV`, before `start` returns."""

    async def on_draining(self) -> None:
        """Stop taking work that is not a request (e.g. a queue consumer): runs after the
        endpoints stopped listening, before in-flight work is awaited."""

    async def on_stop(self) -> None:
        """Close what `on_start` opened: runs after the last request finished."""

    async def start(self) -> None:
        await self.on_start()
        self._micro = _MicroService(
            self.nc,
            ServiceConfig(
                name=self.name,
                version=__version__,
                description=self.description,
                queue_group=self.name,
                metadata=instance_metadata(),
            ),
            self._tallies,
        )
        await self._micro.start()
        for endpoint in self.endpoints():
            await self.listen(endpoint)
        await self.on_listening()
        # nats-py may write a flush's PING ahead of SUBs still buffered; a second round trip
        # makes sure the server has every endpoint before start() returns.
        await self.nc.flush()
        await self.nc.flush()
        self.log.info("service_started", endpoints=sorted(self._tallies))

    async def listen(self, endpoint: Endpoint) -> None:
        """Answer `endpoint` from now on (also after start, e.g. a tool that appeared)."""
        handler = self._bounded(endpoint.subject, self._server(endpoint))
        micro = self._listening()
        if endpoint.group is None:
            await micro.add_endpoint(name=endpoint.name, subject=endpoint.subject, handler=handler)
            return
        prefix = f"{endpoint.group}."
        if not endpoint.subject.startswith(prefix):
            raise ValueError(f"{endpoint.subject!r} is not in the group {endpoint.group!r}")
        await micro.add_group(name=endpoint.group).add_endpoint(
            name=endpoint.name,
            subject=endpoint.subject.removeprefix(prefix),
            handler=handler,
            metadata={GROUP_METADATA: endpoint.group},
        )

    async def listen_raw(self, name: str, subject: str, handler: RawHandler) -> None:
        """Answer `subject` with `handler`, for a body that is not a runbus request (the auth
        callout's JWT): bounded, drained and counted like every endpoint."""
        await self._listening().add_endpoint(
            name=name, subject=subject, handler=self._bounded(subject, handler)
        )

    def _listening(self) -> MicroService:
        if self._micro is None:
            raise RuntimeError(f"the {self.name} service is not started")
        return self._micro

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

    def _bounded(self, subject: str, serve: RawHandler) -> Callable[[Request], Awaitable[None]]:
        tally = self._tallies.setdefault(subject, _Tally())

        # nats-py runs one subscription's callbacks one after another; a task per request
        # lets a slow request not block the next, and the semaphore bounds how many run.
        async def dispatch(request: Request) -> None:
            received = tally.arrived()
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(
                self._tallied(serve, request, tally, received)
            )
            self._tasks.add(task)
            task.add_done_callback(self._request_done)

        return dispatch

    async def _tallied(
        self, serve: RawHandler, request: Request, tally: _Tally, received: int
    ) -> None:
        error: str | None = "unanswered"
        try:
            error = await serve(request)
        except Exception:
            self.log.exception("request_unanswered", subject=request.subject)
        finally:
            tally.answer(received, error)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    def _server(self, endpoint: Endpoint) -> RawHandler:
        span_name = f"process {endpoint.span_subject or endpoint.subject}"

        async def serve(request: Request) -> str | None:
            return await self._serve(endpoint, span_name, request)

        return serve

    async def _serve(self, endpoint: Endpoint, span_name: str, request: Request) -> str | None:
        """Handle one request and reply; the error replied with, if any."""
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
        failure: str | None = None
        try:
            try:
                body = decode_untrusted(endpoint.decoder, request.data, "request body")
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
                # A reply the server would refuse is a typed error the caller reads at once,
                # not silence until its timeout.
                self.bus.check_size(request.subject, data)
            except Exception as exc:
                error = handle_failure(
                    exc, self.log, "request_failed", span=span, subject=request.subject
                )
                info = error.to_info()
                data = encode(ErrorReply(error=info))
                reply_headers = {h.ERROR: info.code}
                failure = f"{info.code}: {error.message}"
            try:
                await request.respond(data, headers=reply_headers)
            except ValueError:
                self.log.info("request_without_reply_subject", subject=request.subject)
            return failure
        finally:
            structlog.contextvars.reset_contextvars(**log_tokens)
            otel_context.detach(span_token)
            span.end()
