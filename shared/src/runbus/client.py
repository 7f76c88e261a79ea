"""The client SDK: publish run requests, follow their events with replay, call the
authenticated client API.

    async with runbus.connect(url, token="dev-alice") as client:
        done = await client.run("travel", "Weather in Sydney?", session_id="s1")
        async for event in client.stream("travel", "And in Perth?", session_id="s1"): ...

The connection itself presents the token: the bus's auth service turns it into a NATS user
that may publish run requests and API calls and subscribe only under its own inbox prefix.
What `run`/`stream` send is exactly a `run.request` JSON body with `rb-auth` and `Nats-Msg-Id`
(`<run_id>.<token digest>`: the dedupe key names the credential, so nobody else's request of
the same run id is ever dropped as a duplicate of this one), so any NATS client connected with
the token can do the same by hand. Events are read from
the events stream by an ordered consumer delivering into that inbox (the live subject is not
the client's to subscribe to): a client that starts late or reconnects replays from the start
(or after a sequence it saw) with no gap and no duplicate, then follows live.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any, Final, TypeVar

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from . import blobs, ops, subjects
from . import headers as h
from .errors import (
    Conflict,
    DeadlineExceeded,
    RemoteError,
    Unauthenticated,
    Unavailable,
    remote_error,
)
from .expiring_user import ExpiringUserConnection
from .messages import (
    ChatMessage,
    OutputFormat,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunRequest,
    TextContent,
    ToolSpec,
    encode,
)
from .messages.auth import Identity, WhoAmI
from .messages.runs import RUN_EVENT_DECODER, RunGet
from .ops import Op
from .telemetry import inject, messaging_attributes, traceparent_trace_id
from .tokens import run_msg_id, token_digest

Req = TypeVar("Req", bound=msgspec.Struct)
Rep = TypeVar("Rep", bound=msgspec.Struct)
API_PREFIX: Final = subjects.api("")
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
    trace_id: str = ""
    """The run's trace id (32 hex digits, as Jaeger shows it): every event is published inside
    the run's trace, with its W3C `traceparent`; empty when it carried none or a malformed one."""


JS_APIS = (subjects.CLIENT_JS_API, "$JS.API")
DUPLICATE_CHECKS = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Pauses between asking for the caller's own record of a run id JetStream called a
duplicate (about 1.5 s in all: a record is written as its run starts)."""


LIVE_CHECK = 1.0
"""Seconds between checks, while a run's live events are awaited, that the connection is not
closed for good."""


class _LiveEvents:
    """Every event of one user's runs from the moment it was made, through one ordered
    consumer delivering into the connection's inbox, handed to the runs `stream` waits on (by
    the run id, the subject's last token); the others' are dropped."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[asyncio.Queue[Msg]]] = {}
        self.subscription: PushSubscription

    async def on_event(self, msg: Msg) -> None:
        for queue in self.waiting.get(msg.subject.rpartition(".")[2], ()):
            queue.put_nowait(msg)


def new_run_id() -> str:
    return f"r-{uuid.uuid4().hex[:16]}"


class RunbusClient:
    def __init__(self, nc: NATS, *, token: str, identity: Identity | None = None) -> None:
        self.nc = nc
        self.token = token
        self.tracer = trace.get_tracer("runbus.client")
        self._identity = identity
        self._js_api = ""
        self._live: _LiveEvents | None = None
        self._live_lock = asyncio.Lock()

    async def identity(self) -> Identity:
        """Which owner the token stands for (asked of the auth service once)."""
        if self._identity is None:
            try:
                reply = await self.nc.request(
                    ops.AUTH_WHOAMI.subject,
                    encode(WhoAmI()),
                    timeout=10,
                    headers={h.AUTH: f"Bearer {self.token}"},
                )
            except nats.errors.NoRespondersError:
                raise Unavailable("no auth service answers: is runbus up?") from None
            except nats.errors.TimeoutError:
                raise DeadlineExceeded("the auth service did not answer whoami") from None
            if (error := remote_error(reply.headers, reply.data)) is not None:
                raise error
            self._identity = ops.AUTH_WHOAMI.decode_reply.decode(reply.data)
        return self._identity

    async def events_subject(self, run_id: str) -> str:
        """The subject this user's run `run_id` publishes its events on."""
        me = await self.identity()
        return subjects.events(me.tenant, me.user_id, run_id)

    async def start(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str | None = None,
        output_format: OutputFormat | None = None,
        client_tools: Sequence[ToolSpec] = (),
    ) -> str:
        """Publish a run request and return its run id (without waiting for it).
        `output_format`: the shape this run's answer must have, in place of the agent's;
        `client_tools`: the caller's own tools (`RunRequest.client_tools`)."""
        run_id = run_id or new_run_id()
        await self._start(
            agent,
            message,
            session_id=session_id,
            run_id=run_id,
            output_format=output_format,
            client_tools=client_tools,
        )
        return run_id

    async def _start(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str,
        output_format: OutputFormat | None = None,
        client_tools: Sequence[ToolSpec] = (),
    ) -> bool:
        """`start`; True when JetStream already held the request (the caller's own: a
        re-sent one)."""
        messages = (
            [ChatMessage(role="user", contents=[TextContent(text=message)])]
            if isinstance(message, str)
            else message
        )
        # A large image or file is stored once in the object store and sent by reference.
        messages = await blobs.offload(self.nc, messages)
        request = RunRequest(
            run_id=run_id,
            agent=agent,
            session_id=session_id,
            input=messages,
            output_format=output_format,
            client_tools=list(client_tools),
        )
        data = encode(request)
        subject = subjects.runs(agent)
        with self.tracer.start_as_current_span(
            f"send {subjects.RUNS_TEMPLATE}",
            kind=SpanKind.PRODUCER,
            attributes=messaging_attributes(subject, "send", message_size=len(data)),
        ):
            headers = {h.AUTH: f"Bearer {self.token}", h.MSG_ID: run_msg_id(self.token, run_id)}
            inject(headers)
            try:
                ack = await self.nc.jetstream().publish(subject, data, headers=headers)
            except nats.errors.NoRespondersError:
                raise Unavailable(
                    "no run queue on this NATS: is the gateway running (`runbus up`)?"
                ) from None
        if ack.duplicate:
            await self._own_duplicate(run_id)
        return bool(ack.duplicate)

    async def _own_duplicate(self, run_id: str) -> None:
        """A run request JetStream already holds: fine if it is the caller's own (a retried
        publish), a conflict if the id is another owner's. The caller's own record may lag
        its request by a moment, so not-found is asked again for a short while."""
        for wait in DUPLICATE_CHECKS:
            try:
                await self.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
                return
            except RemoteError as exc:
                if exc.known_code != "not_found":
                    raise
            await asyncio.sleep(wait)
        raise Conflict(f"run id {run_id!r} is already in use; start the run with a new id")

    async def start_traced(
        self,
        agent: str,
        message: str | list[ChatMessage],
        *,
        session_id: str,
        run_id: str | None = None,
        output_format: OutputFormat | None = None,
        client_tools: Sequence[ToolSpec] = (),
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
                run_id = await self.start(
                    agent,
                    message,
                    session_id=session_id,
                    run_id=run_id,
                    output_format=output_format,
                    client_tools=client_tools,
                )
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
        """Start a run and yield its events until `run.completed` or `run.failed`.

        The events come through the connection's one ordered consumer of this user's events
        (`_live_events`), delivering into its own inbox (a client subscribes nowhere else):
        made before the first request it serves is published, so nothing is missed, even
        across a reconnect, and no run waits for a consumer of its own. A re-sent request of
        a run that already ran replays that run's events from the stream.
        """
        run_id = run_id or new_run_id()
        live = await self._live_events()
        arrived: asyncio.Queue[Msg] = asyncio.Queue()
        waiting = live.waiting.setdefault(run_id, [])
        waiting.append(arrived)
        try:
            duplicate = await self._start(agent, message, session_id=session_id, run_id=run_id)
            if duplicate:
                replay = await self._subscribe(run_id, 0)
                async with aclosing(self._events(run_id, replay, timeout)) as events:
                    async for item in events:
                        yield item.event
                return
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(f"no event from run {run_id} for {timeout:.0f}s")
                try:
                    async with asyncio.timeout(min(left, LIVE_CHECK)):
                        msg = await arrived.get()
                except TimeoutError:
                    if self.nc.is_closed:  # it gave up reconnecting: say so, as next_msg does
                        raise nats.errors.ConnectionClosedError from None
                    continue
                event = RUN_EVENT_DECODER.decode(msg.data)
                deadline = time.monotonic() + timeout
                yield event
                if isinstance(event, RunCompleted | RunFailed):
                    return
        finally:
            waiting.remove(arrived)
            if not waiting:
                live.waiting.pop(run_id, None)

    async def _live_events(self) -> "_LiveEvents":
        """The connection's consumer of every event of this user's runs from now on (made on
        first use; it lasts as long as the connection, and follows it across reconnects)."""
        async with self._live_lock:
            if self._live is None:
                live = _LiveEvents()
                me = await self.identity()
                config = ConsumerConfig(
                    name=f"live-{uuid.uuid4().hex}", deliver_policy=DeliverPolicy.NEW
                )
                live.subscription = await self._consumer(
                    subjects.owner_events(me.tenant, me.user_id), config, live.on_event
                )
                self._live = live
            return self._live

    async def _subscribe(self, run_id: str, after: int) -> PushSubscription:
        config = ConsumerConfig(name=f"follow-{uuid.uuid4().hex}")
        if after:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = after + 1
        return await self._consumer(await self.events_subject(run_id), config)

    async def _consumer(
        self,
        subject: str,
        config: ConsumerConfig,
        on_event: Callable[[Msg], Awaitable[None]] | None = None,
    ) -> PushSubscription:
        """An ordered consumer of `subject` in the events stream. Named: its create subject
        then carries the filter, the form the bus's permissions pin to this user's events."""
        # A token connection reaches JetStream under the clients' API prefix; a connection
        # inside the services' account (or on an open bus) under JetStream's own.
        for api in (self._js_api,) if self._js_api else JS_APIS:
            try:
                subscription = await self.nc.jetstream(prefix=api).subscribe(
                    subject,
                    stream=subjects.EVENTS_STREAM,
                    ordered_consumer=True,
                    config=config,
                    cb=on_event,
                )
            except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
                continue
            self._js_api = api
            return subscription
        raise Unavailable("no JetStream answers for the events stream: is runbus up?")

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
                yield SequencedEvent(
                    seq=msg.metadata.sequence.stream,
                    event=event,
                    trace_id=traceparent_trace_id(msg.headers),
                )
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

    async def call(self, op: Op[Req, Rep], message: Req, *, timeout: float = 30.0) -> Rep:
        """An authenticated client-API operation: a declared one (`ops.API_RUNS_CANCEL`), or a
        service operation the gateway forwards (`ops.SESSIONS_LIST`)."""
        api = op if op.subject.startswith(API_PREFIX) else ops.api_op(op)
        subject, name = api.subject, api.name
        try:
            reply = await self.nc.request(
                subject,
                encode(message),
                timeout=timeout,
                headers={h.AUTH: f"Bearer {self.token}"},
            )
        except nats.errors.NoRespondersError:
            raise Unavailable(f"no gateway answers {name!r}: is runbus up?") from None
        except nats.errors.TimeoutError:
            raise DeadlineExceeded(f"no reply to {name!r} within {timeout:.0f}s") from None
        if (error := remote_error(reply.headers, reply.data)) is not None:
            raise error
        return api.decode_reply.decode(reply.data)


def refused_message(url: str) -> str:
    return (
        f"NATS at {url} refused the token: it is unknown or expired. Set RUNBUS_TOKEN (CLI) "
        "or pass token= (SDK) to a token of yours; `runbus up` prints the dev tokens."
    )


async def open_connection(
    url: str | list[str],
    token: str,
    *,
    name: str = "runbus-client",
    patience: float | None = None,
    **options: Any,
) -> NATS:
    """A NATS connection that presents `token` and uses that token's inbox prefix.

    A token the bus refuses raises `Unauthenticated` at once (nats-py alone would retry it
    forever); no server within `patience` seconds raises `Unavailable`. When the user the bus
    issued for the token expires, the connection reconnects (`ExpiringUserConnection`).
    """
    servers = [url] if isinstance(url, str) else url
    servers = [part.strip() for item in servers for part in item.split(",") if part.strip()]
    refused = asyncio.Event()
    also = options.pop("error_cb", None)

    async def on_error(exc: Exception) -> None:
        if "authorization violation" in str(exc).lower():
            refused.set()
        if also is not None:
            await also(exc)

    nc = ExpiringUserConnection()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers,
            name=name,
            token=token,
            inbox_prefix=subjects.client_inbox_prefix(token_digest(token)),
            error_cb=on_error,
            **options,
        )
    )
    waiting = asyncio.ensure_future(refused.wait())
    try:
        await asyncio.wait(
            {connecting, waiting}, timeout=patience, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiting.cancel()
    if connecting.done() and connecting.exception() is None:
        return nc
    # Closing first ends nats-py's retries and its socket; the connect attempt then ends too.
    await nc.close()
    connecting.cancel()
    await asyncio.gather(connecting, return_exceptions=True)
    if nc._transport is not None:  # a socket the cancelled attempt had just opened
        nc._transport.close()  # type: ignore[no-untyped-call]
    where = ", ".join(servers)
    if refused.is_set():
        raise Unauthenticated(refused_message(where))
    if connecting.done() and not connecting.cancelled() and connecting.exception() is not None:
        raise Unavailable(f"cannot reach NATS at {where}: {connecting.exception()}")
    raise Unavailable(
        f"no NATS server answered at {where} within {patience:g} s "
        "(start one with `runbus up`, or set RUNBUS_NATS_URL)"
    )


@asynccontextmanager
async def connect(
    url: str | list[str], *, token: str, **options: Any
) -> AsyncIterator[RunbusClient]:
    """A client on its own connection (authenticated by `token`), drained on exit."""
    nc = await open_connection(url, token, **options)
    try:
        yield RunbusClient(nc, token=token)
    finally:
        if nc.is_connected:
            await nc.drain()
        else:
            # Reconnecting (the server is gone, or the bus refuses the token since its user
            # expired): nothing can be drained, and nats-py refuses to try.
            await nc.close()
