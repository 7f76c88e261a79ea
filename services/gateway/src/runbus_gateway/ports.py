"""`RunPorts` over the bus: each method is one request to the service that owns it."""

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

import msgspec
import nats.errors
import structlog
from nats.js.api import PubAck
from opentelemetry.trace import SpanKind

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.errors import IdleTimeout, RemoteError, Unavailable
from runbus.headers import MSG_ID, RunContext
from runbus.messages import (
    ChatMessage,
    CompactRequest,
    FunctionCallContent,
    FunctionResultContent,
    HistoryAppend,
    MemoryHit,
    MemorySearch,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    RunEvent,
    ToolInvoke,
    ToolList,
    ToolSpec,
    encode,
)
from runbus.messages.compaction import CompactResult
from runbus.messages.history import HistoryCompaction
from runbus.messages.sessions import (
    ConcurrencyPolicy,
    SessionGet,
    SessionOpen,
    SessionOpened,
    SessionRecord,
    SessionStateUpdate,
)
from runbus.messages.tools import (
    ApprovalGrant,
    ApprovalRequest,
    ToolInvoked,
)
from runbus.telemetry import inject, messaging_attributes

from .agents import CompactionPolicy, MemoryPolicy
from .approvals import Approvals
from .catalog import ToolCatalogCache
from .history_writes import store_checkpoint, store_compaction

NO_SETTINGS = ModelSettings()
TOOL_RETRY_PAUSES: Final = (0.2, 1.0)
"""Seconds before the second and the third try of a tool call lost on the way."""

log = structlog.get_logger()


def tool_retry_pause(exc: Exception, tries: int, time_left: float | None) -> float | None:
    """Seconds to wait before sending a failed tool call again after `tries` tries, or None
    when the model gets the error now.

    Only a call lost on the way goes again: its executor replica died or stalled, or NATS lost
    the request or the reply (`IdleTimeout`), or NATS did not answer the executor in time (a
    remote `unavailable`). The same call id again is safe: the executor runs a side-effecting
    call at most once and answers a repeat with the recorded result. A tool no replica serves
    (no responders) or one that refused the call is the model's to handle at once, and so is
    a call the run's deadline leaves no time to try again.
    """
    lost = isinstance(exc, IdleTimeout) or (
        isinstance(exc, RemoteError) and exc.remote_code == Unavailable.code
    )
    if not lost or tries > len(TOOL_RETRY_PAUSES):
        return None
    pause = TOOL_RETRY_PAUSES[tries - 1]
    if time_left is not None and time_left <= pause:
        return None
    return pause


def owned_run(ctx: RunContext) -> str:
    """The run with its owner: what keys anything per run that another owner must not share."""
    return f"{ctx.prop('tenant')}.{ctx.prop('user_id')}.{ctx.run_id}"


class BusPorts:
    def __init__(self, bus: Bus, approvals: Approvals) -> None:
        self.bus = bus
        self.approvals = approvals
        self.catalog = ToolCatalogCache()
        self._unsettled: dict[str, list[_Published]] = defaultdict(list)

    async def open_session(self, ctx: RunContext, policy: ConcurrencyPolicy) -> SessionOpened:
        return await self.bus.call(
            ops.SESSIONS_OPEN, SessionOpen(session_id=ctx.session_id, policy=policy), ctx=ctx
        )

    async def get_session(self, ctx: RunContext) -> SessionRecord:
        reply = await self.bus.call(
            ops.SESSIONS_GET, SessionGet(session_id=ctx.session_id), ctx=ctx
        )
        return reply.record

    async def update_state(
        self, ctx: RunContext, key: str, value: Any, expected_revision: int
    ) -> SessionRecord:
        reply = await self.bus.call(
            ops.SESSIONS_STATE_UPDATE,
            SessionStateUpdate(
                session_id=ctx.session_id,
                key=key,
                value=value,
                expected_revision=expected_revision,
            ),
            ctx=ctx,
        )
        return reply.record

    async def search_memory(
        self, ctx: RunContext, query: str, policy: MemoryPolicy
    ) -> list[MemoryHit]:
        scope = policy.search_scope
        reply = await self.bus.call(
            ops.MEMORY_SEARCH,
            MemorySearch(
                query=query[:8192],
                scope=scope if isinstance(scope, str) else "user",
                match=None if isinstance(scope, str) else list(scope),
                limit=policy.limit,
                min_score=policy.min_score,
            ),
            ctx=ctx,
        )
        return reply.hits

    async def list_tools(self, ctx: RunContext, names: list[str]) -> list[ToolSpec]:
        if not names:
            return []

        async def fetch() -> list[ToolSpec]:
            request = ToolList(names=names)
            reply = await self.bus.call(ops.TOOLS_LIST, request, ctx=ctx)
            return reply.tools

        return await self.catalog.get((ctx.agent, ctx.prop("tenant"), tuple(names)), fetch)

    async def compact(
        self, ctx: RunContext, messages: list[ChatMessage], policy: CompactionPolicy
    ) -> CompactResult:
        return await self.bus.call(
            ops.COMPACTION_COMPACT,
            CompactRequest(
                messages=messages,
                max_tokens=policy.max_tokens,
                strategy=policy.strategy,
                tokenizer=policy.tokenizer,
            ),
            ctx=ctx,
        )

    async def complete(
        self,
        ctx: RunContext,
        route: str,
        messages: list[ChatMessage],
        tools: list[ToolSpec],
        message_id: str,
        settings: ModelSettings = NO_SETTINGS,
    ) -> ModelResponse:
        request = ModelRequest(
            route=route,
            messages=messages,
            tools=tools,
            stream_to=subjects.events(ctx.prop("tenant"), ctx.prop("user_id"), ctx.run_id),
            message_id=message_id,
            max_output_tokens=settings.max_output_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop=settings.stop,
            seed=settings.seed,
        )
        # Waits as long as the router reports progress (bounded by the run's deadline); the
        # router retries and fails over itself, and stops the provider when this wait ends.
        return await self.bus.call(ops.MODEL_COMPLETE, request, ctx=ctx, progress=True)

    async def invoke_tool(
        self,
        ctx: RunContext,
        call: FunctionCallContent,
        approval: ApprovalGrant | None = None,
        *,
        first_send: bool = False,
    ) -> ToolInvoked:
        # A tool that is down or refuses the call is something the model can react to, so it
        # becomes an error result rather than a failed run; a call lost on the way is first
        # sent again (`tool_retry_pause`).
        invoke = ToolInvoke(
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
            approval=approval,
            first_send=first_send,
        )
        tries = 0
        while True:
            tries += 1
            try:
                return await self.bus.call(
                    ops.TOOL_INVOKE.at(call.name),
                    # Sent again, it may have reached an executor the first time.
                    invoke if tries == 1 else msgspec.structs.replace(invoke, first_send=False),
                    ctx=ctx,
                    progress=True,  # a long tool is bounded by its own timeout, not the hop's
                )
            except (RemoteError, Unavailable) as exc:
                pause = tool_retry_pause(exc, tries, ctx.time_left())
                if pause is None:
                    # The catalogue may offer a tool that is gone: ask again next run.
                    self.catalog.forget(ctx.agent, ctx.prop("tenant"))
                    return ToolInvoked(
                        result=FunctionResultContent(call_id=call.call_id, error=str(exc))
                    )
                log.warning(
                    "tool_call_sent_again", tool=call.name, call_id=call.call_id, error=str(exc)
                )
                await asyncio.sleep(pause)

    async def await_approval(
        self,
        ctx: RunContext,
        call: FunctionCallContent,
        request: ApprovalRequest,
        announce: Callable[[], Awaitable[None]],
    ) -> ApprovalGrant:
        return await self.approvals.wait(
            ctx.run_id,
            call.call_id,
            ctx.prop("tenant"),
            ctx.prop("user_id"),
            request,
            announce=announce,
        )

    async def append_history(
        self,
        ctx: RunContext,
        messages: list[ChatMessage],
        *,
        release: bool = False,
        history_length: int | None = None,
        compaction: HistoryCompaction | None = None,
        history_end: int | None = None,
        incarnation: str = "",
    ) -> int | None:
        # A checkpoint goes straight into the history stream, with the persisted compaction it
        # carries; the release (a session record write) goes through the service, and so does
        # every append of a run that does not know its session's incarnation: the service
        # stamps those with the record's (history_writes.py).
        if (
            history_end is not None
            and not release
            and incarnation
            and (
                compaction is None
                or await store_compaction(self.bus, ctx, compaction, history_end, incarnation)
            )
        ):
            end = await store_checkpoint(self.bus, ctx, messages, history_end, incarnation)
            if end is not None:
                return end
        reply = await self.bus.call(
            ops.HISTORY_APPEND,
            HistoryAppend(
                session_id=ctx.session_id,
                messages=messages,
                release=release,
                history_length=history_length,
                compaction=compaction,
                incarnation=incarnation,
            ),
            ctx=ctx,
        )
        return reply.history_end

    async def store_memory(self, ctx: RunContext, texts: list[str]) -> None:
        """Hand the statements to the memory service's write stream: the run waits for
        JetStream's ack, not for embedding and upsert, and a crash loses no write."""
        message = MemoryStore(texts=[t[:8192] for t in texts], sources=["external"] * len(texts))
        data = encode(message)
        try:
            with self.bus.tracer.start_as_current_span(
                f"send {subjects.MEMORY_WRITES}",
                kind=SpanKind.PRODUCER,
                attributes=messaging_attributes(
                    subjects.MEMORY_WRITES, "send", message_size=len(data)
                ),
            ):
                headers = ctx.to_headers()
                headers[MSG_ID] = f"{ctx.run_id}:memory"
                inject(headers)
                await self.bus.stream_publish(subjects.MEMORY_WRITES, data, headers)
        except nats.errors.NoRespondersError:
            # No write stream (a memory service that never started): store it directly.
            await self.bus.call(ops.MEMORY_STORE, message, ctx=ctx)

    async def emit(self, ctx: RunContext, event: RunEvent, *, event_id: str) -> None:
        """Publish a run event into the events stream without waiting for its ack.

        `Nats-Msg-Id` = `<tenant>.<user_id>.<run_id>:<event_id>`, so a resumed run that emits
        an event again is stored once, and no other owner's event can be taken for it;
        `settle()` waits for the acks before the run request is acked.
        """
        headers = ctx.to_headers()
        headers[MSG_ID] = f"{owned_run(ctx)}:{event_id}"
        inject(headers)
        subject = subjects.events(ctx.prop("tenant"), ctx.prop("user_id"), ctx.run_id)
        data = encode(event)
        ack = await self.bus.stream_publish_async(subject, data, headers)
        self._unsettled[owned_run(ctx)].append(_Published(subject, data, headers, ack))

    async def settle(self, ctx: RunContext) -> None:
        """Wait until every event of the run is stored in the events stream.

        An ack lost with a NATS node never resolves, so the wait is bounded; what is still
        unconfirmed then is published once more under its own `Nats-Msg-Id` (the stream keeps
        one copy) and waited on. Only if that fails too is the run `Unavailable`: delivered
        again, it publishes its events under the same ids.
        """
        published = self._unsettled.pop(owned_run(ctx), [])
        if not published:
            return
        limit = self.bus.request_timeout
        _, lost = await asyncio.wait([p.ack for p in published], timeout=limit)
        for ack in lost:
            ack.cancel()  # never resolves now: nobody is left to wait on it
        unconfirmed = [p for p in published if not _stored(p.ack)]
        if not unconfirmed:
            return
        try:
            async with asyncio.timeout(limit):
                for p in unconfirmed:
                    await self.bus.stream_publish(p.subject, p.data, p.headers)
        except (TimeoutError, nats.errors.Error) as exc:
            raise Unavailable(
                f"the events stream did not confirm {len(unconfirmed)} event(s) of run "
                f"{ctx.run_id!r} within {2 * limit:.0f}s ({type(exc).__name__})"
            ) from None


class _Published(NamedTuple):
    """An event sent to the stream whose ack `settle` has yet to see."""

    subject: str
    data: bytes
    headers: dict[str, str]
    ack: asyncio.Future[PubAck]


def _stored(ack: asyncio.Future[PubAck]) -> bool:
    """The stream confirmed it (not cancelled, not failed)."""
    return not ack.cancelled() and ack.exception() is None
