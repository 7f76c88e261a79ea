"""`RunPorts` over the bus: each method is one request to the service that owns it."""

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import structlog
from opentelemetry.trace import SpanKind

from runbus import ops, subjects
from runbus.bus import Bus
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
    OutputFormat,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunRequest,
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
from runbus.owners import Owner
from runbus.telemetry import inject, messaging_attributes

from .agents import CompactionPolicy, MemoryPolicy
from .approvals import Approvals
from .catalog import ToolCatalogCache
from .children import ChildRuns
from .client_calls import ClientCalls
from .event_stream import EventStream
from .history_writes import store_checkpoint, store_compaction
from .remote_tasks import RemoteTasks
from .run.a2a_task import RemoteTaskRef
from .tool_calls import invoke_tool

NO_SETTINGS = ModelSettings()

log = structlog.get_logger()


class BusPorts:
    def __init__(self, bus: Bus, approvals: Approvals) -> None:
        self.bus = bus
        self.approvals = approvals
        self.catalog = ToolCatalogCache()
        self.events = EventStream(bus)

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
        *,
        output: OutputFormat | None = None,
        stream: bool = True,
    ) -> ModelResponse:
        events = subjects.events(ctx.prop("tenant"), ctx.prop("user_id"), ctx.run_id)
        request = ModelRequest(
            route=route,
            messages=messages,
            tools=tools,
            stream_to=events if stream else None,
            message_id=message_id,
            max_output_tokens=settings.max_output_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop=settings.stop,
            seed=settings.seed,
            response_format=output,
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
        return await invoke_tool(self.bus, self.catalog, ctx, call, approval, first_send)

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

    @functools.cached_property
    def client_calls(self) -> ClientCalls:
        """Client-tool calls, in the approvals bucket (built on first use)."""
        return ClientCalls(self.approvals.bucket.kv)

    async def hand_to_client(self, ctx: RunContext, call: FunctionCallContent) -> None:
        await self.client_calls.record(ctx.run_id, Owner.of(ctx), call)

    async def await_client(
        self, ctx: RunContext, call: FunctionCallContent
    ) -> FunctionResultContent:
        return await self.client_calls.wait(ctx.run_id, Owner.of(ctx), call)

    @functools.cached_property
    def remote_tasks(self) -> RemoteTasks:
        """Remote A2A tasks by call, in the approvals bucket (built on first use)."""
        return RemoteTasks(self.approvals.bucket.kv)

    async def remote_task(self, ctx: RunContext, call_id: str) -> RemoteTaskRef | None:
        return await self.remote_tasks.get(Owner.of(ctx), ctx.run_id, call_id)

    async def remember_remote_task(self, ctx: RunContext, call_id: str, ref: RemoteTaskRef) -> None:
        await self.remote_tasks.put(Owner.of(ctx), ctx.run_id, call_id, ref)

    @functools.cached_property
    def children(self) -> ChildRuns:
        """Child runs (agents called as tools), built on first use."""
        return ChildRuns(self.bus)

    async def call_agent(
        self, ctx: RunContext, request: RunRequest, tool: str, *, first_send: bool
    ) -> RunCompleted | RunFailed:
        return await self.children.call_agent(ctx, request, tool, first_send=first_send)

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
        abandon: bool = False,
        closes: bool = False,
    ) -> int | None:
        # A checkpoint goes straight into the history stream, with the persisted compaction it
        # carries; the release (a session record write) goes through the service, and so does
        # every append of a run that does not know its session's incarnation: the service
        # stamps those with the record's (history_writes.py).
        if (
            history_end is not None
            and not release
            and not abandon
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
                abandon=abandon,
                closes=closes,
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
        """Publish a run event without waiting for its ack (`EventStream.emit`)."""
        await self.events.emit(ctx, event, event_id=event_id)

    async def settle(self, ctx: RunContext) -> set[str]:
        """Wait until every event of the run is stored in the events stream; the ids
        (`event_id`) of those the stream already held."""
        run = Owner.of(ctx).key(ctx.run_id)
        held = await self.events.settle(ctx)
        return {msg_id.removeprefix(f"{run}:") for msg_id in held}

    async def checkpointed(self, ctx: RunContext) -> list[ChatMessage]:
        """The checkpoints of the run's stored events (`EventStream.checkpointed`)."""
        return await self.events.checkpointed(ctx)
