"""`RunPorts` over the bus: each method is one request to the service that owns it."""

from runbus import subjects
from runbus.bus import Bus
from runbus.errors import RemoteError, Unavailable
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    CompactRequest,
    FunctionCallContent,
    FunctionResultContent,
    HistoryAppend,
    HistoryLoad,
    MemoryHit,
    MemorySearch,
    MemoryStore,
    ModelRequest,
    ModelResponse,
    RunEvent,
    ToolInvoke,
    ToolList,
    ToolSpec,
)
from runbus.messages.compaction import COMPACT_RESULT_DECODER
from runbus.messages.history import HISTORY_APPENDED_DECODER, HISTORY_LOADED_DECODER
from runbus.messages.memory import MEMORY_HITS_DECODER, MEMORY_STORED_DECODER, SearchScope
from runbus.messages.model import MODEL_RESPONSE_DECODER
from runbus.messages.tools import TOOL_CATALOG_DECODER, TOOL_INVOKED_DECODER


class BusPorts:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def load_history(self, ctx: RunContext) -> list[ChatMessage]:
        reply = await self.bus.request(
            subjects.HISTORY_LOAD,
            HistoryLoad(session_id=ctx.session_id),
            HISTORY_LOADED_DECODER,
            ctx=ctx,
        )
        return reply.messages

    async def search_memory(
        self, ctx: RunContext, query: str, scope: SearchScope, limit: int
    ) -> list[MemoryHit]:
        reply = await self.bus.request(
            subjects.MEMORY_SEARCH,
            MemorySearch(query=query[:8192], scope=scope, limit=limit),
            MEMORY_HITS_DECODER,
            ctx=ctx,
        )
        return reply.hits

    async def list_tools(self, ctx: RunContext, names: list[str]) -> list[ToolSpec]:
        if not names:
            return []
        reply = await self.bus.request(
            subjects.TOOLS_LIST, ToolList(names=names), TOOL_CATALOG_DECODER, ctx=ctx
        )
        return reply.tools

    async def compact(
        self, ctx: RunContext, messages: list[ChatMessage], max_tokens: int | None
    ) -> list[ChatMessage]:
        reply = await self.bus.request(
            subjects.COMPACTION_COMPACT,
            CompactRequest(messages=messages, max_tokens=max_tokens),
            COMPACT_RESULT_DECODER,
            ctx=ctx,
        )
        return reply.messages

    async def complete(
        self,
        ctx: RunContext,
        route: str,
        messages: list[ChatMessage],
        tools: list[ToolSpec],
        message_id: str,
    ) -> ModelResponse:
        request = ModelRequest(
            route=route,
            messages=messages,
            tools=tools,
            stream_to=subjects.events(ctx.run_id),
            message_id=message_id,
        )
        return await self.bus.request(
            subjects.MODEL_COMPLETE, request, MODEL_RESPONSE_DECODER, ctx=ctx
        )

    async def invoke_tool(
        self, ctx: RunContext, call: FunctionCallContent
    ) -> FunctionResultContent:
        # A tool that is down or refuses the call is something the model can react to, so it
        # becomes an error result rather than a failed run.
        try:
            reply = await self.bus.request(
                subjects.tool_invoke(call.name),
                ToolInvoke(call_id=call.call_id, name=call.name, arguments=call.arguments),
                TOOL_INVOKED_DECODER,
                ctx=ctx,
                span_subject=subjects.TOOL_INVOKE_TEMPLATE,
            )
        except (RemoteError, Unavailable) as exc:
            return FunctionResultContent(call_id=call.call_id, error=str(exc))
        return reply.result

    async def append_history(self, ctx: RunContext, messages: list[ChatMessage]) -> None:
        await self.bus.request(
            subjects.HISTORY_APPEND,
            HistoryAppend(session_id=ctx.session_id, messages=messages),
            HISTORY_APPENDED_DECODER,
            ctx=ctx,
        )

    async def store_memory(self, ctx: RunContext, texts: list[str]) -> None:
        await self.bus.request(
            subjects.MEMORY_STORE,
            MemoryStore(texts=[t[:8192] for t in texts]),
            MEMORY_STORED_DECODER,
            ctx=ctx,
        )

    async def emit(self, ctx: RunContext, event: RunEvent) -> None:
        await self.bus.publish(subjects.events(ctx.run_id), event, ctx=ctx)
