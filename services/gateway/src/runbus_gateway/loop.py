"""The run itself, without a bus: context assembly, the tool loop, checkpoints, memory policy.

Every side effect goes through `RunPorts`, so this module is unit-tested with fakes and the
NATS wiring (`ports.py`) stays thin.
"""

import asyncio
import re
from datetime import UTC, datetime
from typing import Protocol

import msgspec

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    MemoryHit,
    ModelResponse,
    RunCompleted,
    RunEvent,
    RunRequest,
    RunStarted,
    RunToolCall,
    RunToolResult,
    TextContent,
    ToolSpec,
    Usage,
)
from runbus.messages.memory import SearchScope

from .agents import AgentSpec
from .errors import MaxIterationsExceeded

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class RunPorts(Protocol):
    """Everything a run does outside itself; one method per hop."""

    async def load_history(self, ctx: RunContext) -> list[ChatMessage]: ...

    async def search_memory(
        self, ctx: RunContext, query: str, scope: SearchScope, limit: int
    ) -> list[MemoryHit]: ...

    async def list_tools(self, ctx: RunContext, names: list[str]) -> list[ToolSpec]: ...

    async def compact(
        self, ctx: RunContext, messages: list[ChatMessage], max_tokens: int | None
    ) -> list[ChatMessage]: ...

    async def complete(
        self,
        ctx: RunContext,
        route: str,
        messages: list[ChatMessage],
        tools: list[ToolSpec],
        message_id: str,
    ) -> ModelResponse: ...

    async def invoke_tool(
        self, ctx: RunContext, call: FunctionCallContent
    ) -> FunctionResultContent: ...

    async def append_history(self, ctx: RunContext, messages: list[ChatMessage]) -> None: ...

    async def store_memory(self, ctx: RunContext, texts: list[str]) -> None: ...

    async def emit(self, ctx: RunContext, event: RunEvent) -> None: ...


def stamp_input(request: RunRequest, now: datetime) -> list[ChatMessage]:
    """Caller messages with ids derived from the run id, so a redelivered run stores them once."""
    return [
        msgspec.structs.replace(
            message,
            message_id=message.message_id or f"{request.run_id}-in-{index}",
            created_at=message.created_at or now,
            source="external",
        )
        for index, message in enumerate(request.input)
    ]


def memory_message(hits: list[MemoryHit]) -> ChatMessage | None:
    """Recalled memories as one system message, stamped `context_provider` (never stored)."""
    if not hits:
        return None
    lines = "\n".join(f"- {hit.text}" for hit in hits)
    return ChatMessage(
        role="system",
        contents=[TextContent(text=f"What you remember about this user:\n{lines}")],
        message_id="memory",
        source="context_provider",
    )


class Checkpointer:
    """Appends new messages to history in order, in the background of the loop.

    One append is in flight at a time; messages added meanwhile go together in the next one
    (group commit), so history keeps their order. The loop does not wait between steps;
    `flush()` at the end waits for everything and raises if an append failed.
    """

    def __init__(self, ports: RunPorts, ctx: RunContext) -> None:
        self._ports = ports
        self._ctx = ctx
        self._pending: list[ChatMessage] = []
        self._writer: asyncio.Task[None] | None = None
        self._error: Exception | None = None

    def add(self, messages: list[ChatMessage]) -> None:
        self._pending.extend(messages)
        if self._error is None and (self._writer is None or self._writer.done()):
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._ports.append_history(self._ctx, batch)
        except Exception as exc:
            self._error = exc

    async def flush(self) -> None:
        if self._writer is not None:
            await self._writer
        if self._error is not None:
            raise self._error


def refuse_unlisted(call: FunctionCallContent, agent: AgentSpec) -> FunctionResultContent | None:
    """The model may only call the agent's tools, by a name that is safe in a subject."""
    if TOOL_NAME.fullmatch(call.name) and call.name in agent.tools:
        return None
    return FunctionResultContent(
        call_id=call.call_id, error=f"no tool named {call.name[:64]!r} is available to this agent"
    )


def user_statements(inputs: list[ChatMessage]) -> list[str]:
    """What the user stated (not asked) in this run: the default memory policy stores these,
    never the assistant's claims."""
    texts = (m.text.strip() for m in inputs if m.role == "user")
    return [t for t in texts if t and not t.endswith("?")]


async def _call_tool(
    ports: RunPorts, ctx: RunContext, agent: AgentSpec, call: FunctionCallContent
) -> FunctionResultContent:
    return refuse_unlisted(call, agent) or await ports.invoke_tool(ctx, call)


async def execute_run(
    request: RunRequest, agent: AgentSpec, ctx: RunContext, ports: RunPorts
) -> RunCompleted:
    """One run: load context, loop model ↔ tools, checkpoint every step, apply memory policy."""
    await ports.emit(
        ctx, RunStarted(run_id=ctx.run_id, session_id=ctx.session_id, agent=agent.name)
    )
    inputs = stamp_input(request, datetime.now(UTC))
    query = inputs[-1].text if inputs else ""

    async def no_hits() -> list[MemoryHit]:
        return []

    history, hits, tools = await asyncio.gather(
        ports.load_history(ctx),
        ports.search_memory(ctx, query, agent.memory.search_scope, agent.memory.limit)
        if agent.memory.enabled and query
        else no_hits(),
        ports.list_tools(ctx, agent.tools),
    )
    instructions = ChatMessage(
        role="system",
        contents=[TextContent(text=agent.instructions.strip())],
        message_id="instructions",
        source="context_provider",
    )
    recalled = memory_message(hits)
    prompt = [instructions, *([recalled] if recalled else []), *history, *inputs]

    checkpoint = Checkpointer(ports, ctx)
    response: list[ChatMessage] = []
    usage = Usage()
    for step in range(agent.max_iterations):
        view = await ports.compact(ctx, prompt, agent.compaction.max_tokens)
        reply = await ports.complete(ctx, agent.model, view, tools, f"{ctx.run_id}-m{step}")
        usage += reply.usage
        message = msgspec.structs.replace(
            reply.message, message_id=f"{ctx.run_id}-m{step}", source="external"
        )
        prompt.append(message)
        response.append(message)
        # The inputs wait for the first reply: until the run is acked the queued request
        # still holds them, and one append carries both.
        checkpoint.add([*inputs, message] if step == 0 else [message])
        calls = message.function_calls
        if not calls:
            break
        for call in calls:
            await ports.emit(ctx, RunToolCall(run_id=ctx.run_id, call=call))
        results = await asyncio.gather(*(_call_tool(ports, ctx, agent, c) for c in calls))
        for result in results:
            await ports.emit(ctx, RunToolResult(run_id=ctx.run_id, result=result))
        tool_message = ChatMessage(
            role="tool",
            contents=list(results),
            message_id=f"{ctx.run_id}-t{step}",
            created_at=datetime.now(UTC),
        )
        prompt.append(tool_message)
        response.append(tool_message)
        checkpoint.add([tool_message])
    else:
        await checkpoint.flush()
        raise MaxIterationsExceeded(agent.max_iterations)

    statements = user_statements(inputs)
    store = (
        ports.store_memory(ctx, statements)
        if agent.memory.store_user_statements and statements
        else None
    )
    await asyncio.gather(checkpoint.flush(), *([store] if store else []))
    return RunCompleted(run_id=ctx.run_id, response=response, text=response[-1].text, usage=usage)
