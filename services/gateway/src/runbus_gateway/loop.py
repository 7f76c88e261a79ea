"""The run itself, without a bus: context assembly, the tool loop, checkpoints, resume, memory
policy.

Every side effect goes through `RunPorts`, so this module is unit-tested with fakes and the
NATS wiring (`ports.py`) stays thin.
"""

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Protocol

import msgspec
import structlog
from opentelemetry import trace

from runbus.errors import BadRequest, RemoteError
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    MemoryHit,
    ModelResponse,
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunRequest,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolResult,
    TextContent,
    ToolSpec,
    Usage,
)
from runbus.messages.compaction import CompactResult
from runbus.messages.history import REPAIR_SUFFIX, HistoryCompaction
from runbus.messages.memory import MEMORY_SEARCH_TOOL
from runbus.messages.sessions import ConcurrencyPolicy, SessionOpened
from runbus.messages.tools import ApprovalGrant, ApprovalRequest, ToolInvoked

from .agents import AgentSpec, CompactionPolicy, MemoryPolicy
from .errors import InputTooLarge, MaxIterationsExceeded, ToolErrorLimit
from .harness.evaluators import Continue, feedback_message
from .harness.guardrails import Refusal
from .harness.programs import ProgramRun, run_program
from .harness.runtime import Harness, with_context
from .harness.state import SessionState, StatePort
from .recall import memorable_statements, recall_message

log = structlog.get_logger()

TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_INPUT_BYTES: Final = 256 * 1024


class RunPorts(StatePort, Protocol):
    """Everything a run does outside itself; one method per hop (the state-bag methods come
    from `StatePort`)."""

    async def open_session(self, ctx: RunContext, policy: ConcurrencyPolicy) -> SessionOpened: ...

    async def search_memory(
        self, ctx: RunContext, query: str, policy: MemoryPolicy
    ) -> list[MemoryHit]: ...

    async def list_tools(self, ctx: RunContext, names: list[str]) -> list[ToolSpec]: ...

    async def compact(
        self, ctx: RunContext, messages: list[ChatMessage], policy: CompactionPolicy
    ) -> CompactResult: ...

    async def complete(
        self,
        ctx: RunContext,
        route: str,
        messages: list[ChatMessage],
        tools: list[ToolSpec],
        message_id: str,
    ) -> ModelResponse: ...

    async def invoke_tool(
        self, ctx: RunContext, call: FunctionCallContent, approval: ApprovalGrant | None = None
    ) -> ToolInvoked: ...

    async def await_approval(
        self,
        ctx: RunContext,
        call: FunctionCallContent,
        request: ApprovalRequest,
        announce: Callable[[], Awaitable[None]],
    ) -> ApprovalGrant:
        """Record the request, then `announce` it, then wait for the decision: announced
        first, a person could decide before there was anything to decide."""
        ...

    async def append_history(
        self,
        ctx: RunContext,
        messages: list[ChatMessage],
        *,
        release: bool = False,
        history_length: int | None = None,
        compaction: HistoryCompaction | None = None,
    ) -> None: ...

    async def store_memory(self, ctx: RunContext, texts: list[str]) -> None: ...

    async def emit(self, ctx: RunContext, event: RunEvent, *, event_id: str) -> None: ...


def stamp_input(request: RunRequest, now: datetime) -> list[ChatMessage]:
    """Caller messages with ids derived from the run id, so a redelivered run stores them once.

    Only `user` messages are accepted: `system` is the trusted role and a caller-made
    `assistant` or `tool` message would put words in the model's or a tool's mouth.
    """
    size = 0
    for index, message in enumerate(request.input):
        if message.role != "user":
            raise BadRequest(
                f"input[{index}].role is {message.role!r}; a run request carries user messages",
                details={"field": f"input[{index}].role"},
            )
        size += len(message.text.encode())
    if size > MAX_INPUT_BYTES:
        raise InputTooLarge(size, MAX_INPUT_BYTES)
    return [
        msgspec.structs.replace(
            message,
            message_id=message_id(request.run_id, f"in{index}"),
            created_at=message.created_at or now,
            source="external",
        )
        for index, message in enumerate(request.input)
    ]


def message_id(run_id: str, part: str) -> str:
    """Id of a message a run makes: `<run_id>:<part>`. The colon cannot occur in a run id, so
    a run's own messages are found in history by prefix without matching another run's."""
    return f"{run_id}:{part}"


def refuse_unlisted(call: FunctionCallContent, agent: AgentSpec) -> FunctionResultContent | None:
    """The model may only call the agent's tools, by a name that is safe in a subject."""
    offered = call.name in agent.tools or (
        agent.memory.offers_tool and call.name == MEMORY_SEARCH_TOOL.name
    )
    if TOOL_NAME.fullmatch(call.name) and offered:
        return None
    return FunctionResultContent(
        call_id=call.call_id, error=f"no tool named {call.name[:64]!r} is available to this agent"
    )


class Checkpointer:
    """Appends new messages to history in order, in the background of the loop.

    One append is in flight at a time; messages added meanwhile go together in the next one
    (group commit), so history keeps their order. The loop does not wait between steps;
    `close()` at the end sends the last append, which also releases the session.
    """

    def __init__(self, ports: RunPorts, ctx: RunContext) -> None:
        self._ports = ports
        self._ctx = ctx
        self._pending: list[ChatMessage] = []
        self._compaction: HistoryCompaction | None = None
        self._persisted: set[str] = set()
        """Ids excluded by the compactions persisted so far in this run."""
        self._writer: asyncio.Task[None] | None = None
        self._error: Exception | None = None

    def add(self, messages: list[ChatMessage]) -> None:
        self._pending.extend(messages)
        self._start()

    def persist(self, compaction: HistoryCompaction) -> None:
        """Store `compaction` after the messages added so far, unless it excludes nothing new
        (the same window, one step later); a newer one pending replaces an older one."""
        if self._persisted.issuperset(compaction.excluded_message_ids):
            return
        self._persisted.update(compaction.excluded_message_ids)
        self._compaction = compaction
        self._start()

    def _start(self) -> None:
        if self._error is None and (self._writer is None or self._writer.done()):
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            while self._pending or self._compaction is not None:
                batch, self._pending = self._pending, []
                compaction, self._compaction = self._compaction, None
                await self._ports.append_history(self._ctx, batch, compaction=compaction)
        except Exception as exc:
            self._error = exc

    async def flush(self) -> None:
        if self._writer is not None:
            await self._writer
        if self._error is not None:
            raise self._error

    async def close(self, history_length: int) -> None:
        """Write what is pending and release the session's claim, in one append."""
        await self.flush()
        batch, self._pending = self._pending, []
        compaction, self._compaction = self._compaction, None
        await self._ports.append_history(
            self._ctx, batch, release=True, history_length=history_length, compaction=compaction
        )


@dataclass
class Progress:
    """Where a run stands: what it produced so far (also what a resumed run finds)."""

    step: int = 0
    response: list[ChatMessage] = field(default_factory=list)
    pending_calls: list[FunctionCallContent] = field(default_factory=list)
    finished: bool = False
    final_text: str | None = None
    """Set when the run ends on something other than an assistant answer (a terminate)."""

    @classmethod
    def from_history(cls, run_id: str, mine: list[ChatMessage]) -> "Progress":
        """Rebuild progress from this run's checkpointed messages (a redelivered run)."""
        progress = cls(response=[m for m in mine if m.role in ("assistant", "tool")])
        progress.step = sum(1 for m in progress.response if m.role == "assistant")
        if progress.response and progress.response[-1].role == "assistant":
            last = progress.response[-1]
            progress.pending_calls = last.function_calls
            progress.finished = not last.function_calls
        return progress


async def open_session(ports: RunPorts, ctx: RunContext, agent: AgentSpec) -> SessionOpened:
    """Open and claim the session; with policy `enqueue`, wait while another run holds it."""
    delay = 0.02
    while True:
        try:
            return await ports.open_session(ctx, agent.concurrency)
        except RemoteError as exc:
            if exc.remote_code != "session_busy" or agent.concurrency != "enqueue":
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def execute_run(
    request: RunRequest,
    agent: AgentSpec,
    ctx: RunContext,
    ports: RunPorts,
    harness: Harness | None = None,
) -> RunCompleted:
    """One run: load context, loop model ↔ tools, checkpoint every step, apply memory policy.

    A redelivered run (same run_id) finds its own checkpointed messages in history and
    continues after them: no model call or tool call that already has a result is repeated.
    The agent's harness (guardrails, todo list, modes, loop mode, program agents) hooks in
    where noted; without one the run is the plain tool loop.
    """
    harness = harness or Harness.from_config(agent.harness)
    inputs = stamp_input(request, datetime.now(UTC))
    await ports.emit(
        ctx,
        RunStarted(run_id=ctx.run_id, session_id=ctx.session_id, agent=agent.name),
        event_id="started",
    )
    if refusal := harness.refuse(inputs):
        return await _refuse(ctx, ports, harness, refusal)
    query = inputs[-1].text if inputs else ""

    async def no_hits() -> list[MemoryHit]:
        return []

    opened, hits, tools = await asyncio.gather(
        open_session(ports, ctx, agent),
        ports.search_memory(ctx, query, agent.memory)
        if agent.memory.searches_before_invoke and query
        else no_hits(),
        ports.list_tools(ctx, agent.tools),
    )
    if agent.memory.offers_tool:
        tools = [*tools, MEMORY_SEARCH_TOOL]
    tools = [*tools, *harness.tools]
    state = SessionState(ports, ctx, opened.record)
    own = message_id(ctx.run_id, "")
    earlier = [m for m in opened.messages if not m.message_id.startswith(own)]
    mine = [
        m
        for m in opened.messages
        if m.message_id.startswith(own) and not m.message_id.endswith(REPAIR_SUFFIX)
    ]
    progress = Progress.from_history(ctx.run_id, mine)
    instructions = ChatMessage(
        role="system",
        contents=[TextContent(text=agent.instructions.strip())],
        message_id="instructions",
        source="context_provider",
    )
    recalled = recall_message(hits)
    resumed_inputs = [m for m in mine if m.role == "user" and ":in" in m.message_id]
    notice = harness.mode_notice(state.bag)
    prompt = [
        instructions,
        *([recalled] if recalled else []),
        *earlier,
        *([notice] if notice else []),
        *(resumed_inputs or inputs),
        *progress.response,
    ]
    if notice:
        await harness.acknowledge_mode(state)
    checkpoint = Checkpointer(ports, ctx)
    if not resumed_inputs:
        checkpoint.add(inputs)
    turn = Turn(agent, ctx, ports, harness, state, tools, prompt, progress, checkpoint)
    try:
        if harness.program is not None:
            usage = await _run_program(turn, resumed_inputs or inputs, earlier, recalled)
        else:
            usage = await _run_passes(turn)
    except BaseException:
        # Whatever stops the run, what it produced so far is saved and the session released
        # before the failure is reported: the next run on the session sees a valid prefix.
        with contextlib.suppress(Exception):
            await checkpoint.close(history_length=len(prompt))
        raise

    statements = memorable_statements(inputs) if agent.memory.store_user_statements else []
    history_length = len(earlier) + len(resumed_inputs or inputs) + len(progress.response)
    await asyncio.gather(
        checkpoint.close(history_length=history_length),
        *([ports.store_memory(ctx, statements)] if statements else []),
    )
    response = [msgspec.structs.replace(m, source="external") for m in progress.response]
    text = progress.final_text if progress.final_text is not None else response[-1].text
    return RunCompleted(run_id=ctx.run_id, response=response, text=text, usage=usage)


async def _refuse(
    ctx: RunContext, ports: RunPorts, harness: Harness, refusal: Refusal
) -> RunCompleted:
    """A guardrail ended the run before any hop: no model call, nothing stored (the refused
    input may be the very secret the guardrail caught)."""
    message, _ = harness.rewrite(
        ChatMessage(
            role="assistant",
            contents=[TextContent(text=refusal.text)],
            message_id=message_id(ctx.run_id, "m0"),
            created_at=datetime.now(UTC),
        )
    )
    trace.get_current_span().set_attribute("runbus.guardrail", refusal.guardrail)
    log.info("run_refused", run_id=ctx.run_id, guardrail=refusal.guardrail)
    await ports.emit(
        ctx,
        RunTextDelta(run_id=ctx.run_id, message_id=message.message_id, delta=message.text),
        event_id="refusal",
    )
    return RunCompleted(run_id=ctx.run_id, response=[message], text=message.text)


@dataclass
class Turn:
    """Everything one run's passes share."""

    agent: AgentSpec
    ctx: RunContext
    ports: RunPorts
    harness: Harness
    state: SessionState
    tools: list[ToolSpec]
    prompt: list[ChatMessage]
    progress: Progress
    checkpoint: Checkpointer


async def _run_passes(turn: Turn) -> Usage:
    """The tool loop, then (loop mode) more passes while the harness's evaluators ask."""
    usage = Usage()
    iteration = 1 + sum(1 for m in turn.progress.response if ":loop" in m.message_id)
    while True:
        usage += await _loop(turn)
        if turn.progress.final_text is not None or not turn.harness.config.loop.enabled:
            return usage
        await turn.state.refresh()
        decision = turn.harness.next_pass(
            turn.state.bag, iteration=iteration, answer=turn.progress.response[-1].text
        )
        if not isinstance(decision, Continue):
            trace.get_current_span().set_attribute("runbus.loop.stop", decision.reason)
            return usage
        feedback = feedback_message(decision, message_id(turn.ctx.run_id, f"loop{iteration}"))
        turn.prompt.append(feedback)
        turn.progress.response.append(feedback)
        turn.checkpoint.add([feedback])
        turn.progress.finished = False
        iteration += 1


async def _run_program(
    turn: Turn,
    inputs: list[ChatMessage],
    history: list[ChatMessage],
    recalled: ChatMessage | None,
) -> Usage:
    """A non-LLM agent answers instead of the model loop, under the same run contract."""
    if turn.progress.finished:
        return Usage()
    assert turn.harness.program is not None
    ctx = turn.ctx
    run = ProgramRun(
        run_id=ctx.run_id,
        session_id=ctx.session_id,
        agent=turn.agent.name,
        user_id=ctx.prop("user_id"),
        tenant=ctx.prop("tenant"),
        inputs=inputs,
        history=history,
        state=turn.state.bag,
        context=[recalled] if recalled else [],
    )
    replies = await run_program(
        turn.harness.program, turn.agent.harness.program or "", run, turn.state
    )
    for index, reply in enumerate(replies):
        reply = msgspec.structs.replace(
            reply, message_id=message_id(ctx.run_id, f"m{index}"), created_at=datetime.now(UTC)
        )
        if index == len(replies) - 1:
            reply, _ = turn.harness.rewrite(reply)
        await turn.ports.emit(
            ctx,
            RunTextDelta(run_id=ctx.run_id, message_id=reply.message_id, delta=reply.text),
            event_id=f"program-{index}",
        )
        turn.prompt.append(reply)
        turn.progress.response.append(reply)
        turn.checkpoint.add([reply])
    turn.progress.finished = True
    return Usage()


def persisted_compaction(result: CompactResult, run_id: str) -> HistoryCompaction | None:
    """What history stores of a compaction (`persist = true`): the compacted messages minus
    context-provider ones. None when it excluded a message of this run: a resumed run finds
    its own messages in history to continue after them, so they are never compacted away."""
    own = message_id(run_id, "")
    excluded = result.report.excluded_message_ids
    if not result.compacted or any(i.startswith(own) for i in excluded):
        return None
    return HistoryCompaction(
        messages=[m for m in result.messages if m.source != "context_provider"],
        excluded_message_ids=excluded,
    )


async def _compact(
    ports: RunPorts,
    ctx: RunContext,
    agent: AgentSpec,
    prompt: list[ChatMessage],
    step: int,
    checkpoint: Checkpointer | None = None,
) -> list[ChatMessage]:
    """The prompt copy the model sees; with `persist`, what it made of the history is also
    stored. An agent without a compaction policy skips the hop: the prompt is already a valid
    provider list (history repairs what it loads)."""
    if not agent.compaction.enabled:
        return prompt
    compacted = await ports.compact(ctx, prompt, agent.compaction)
    persisted = persisted_compaction(compacted, ctx.run_id) if agent.compaction.persist else None
    if persisted is not None and checkpoint is not None:
        checkpoint.persist(persisted)
    if compacted.compacted or any(s.error for s in compacted.report.steps):
        await ports.emit(
            ctx,
            RunCompacted(run_id=ctx.run_id, step=step, report=compacted.report),
            event_id=f"compacted-{step}",
        )
    return compacted.messages


async def _loop(turn: Turn) -> Usage:
    """Model ↔ tools until the model answers without calls; returns the tokens used."""
    agent, ctx, ports, progress = turn.agent, turn.ctx, turn.ports, turn.progress
    usage = Usage()
    failed_steps = 0
    calls = progress.pending_calls
    while not progress.finished:
        if not calls:
            if progress.step >= agent.max_iterations:
                raise MaxIterationsExceeded(agent.max_iterations)
            reply_id = message_id(ctx.run_id, f"m{progress.step}")
            _instruct(turn)
            view = await _compact(ports, ctx, agent, turn.prompt, progress.step, turn.checkpoint)
            todo = turn.harness.todo_message(turn.state.bag)
            view = with_context(view, [todo] if todo else [])
            reply = await ports.complete(ctx, agent.model, view, turn.tools, reply_id)
            usage += reply.usage
            message = msgspec.structs.replace(reply.message, message_id=reply_id, source="external")
            calls = message.function_calls
            if not calls:
                message, appended = turn.harness.rewrite(message)
                if appended:
                    await ports.emit(
                        ctx,
                        RunTextDelta(run_id=ctx.run_id, message_id=reply_id, delta=appended),
                        event_id=f"rewrite-{reply_id}",
                    )
            turn.prompt.append(message)
            progress.response.append(message)
            progress.step += 1
            turn.checkpoint.add([message])
            if not calls:
                progress.finished = True
                break
        # The calls are saved before any runs: a run resumed after a lost checkpoint would
        # ask the model again, get new call ids (the executor's idempotency keys) and repeat
        # side effects. One history round trip per tool step buys exactly-once tools.
        await turn.checkpoint.flush()
        for call in calls:
            await ports.emit(
                ctx, RunToolCall(run_id=ctx.run_id, call=call), event_id=f"call-{call.call_id}"
            )
        results, terminated = await run_tools(turn, calls)
        for result in results:
            await ports.emit(
                ctx,
                RunToolResult(run_id=ctx.run_id, result=result),
                event_id=f"result-{result.call_id}",
            )
        tool_message = ChatMessage(
            role="tool",
            contents=list(results),
            message_id=message_id(ctx.run_id, f"t{progress.step - 1}"),
            created_at=datetime.now(UTC),
        )
        turn.prompt.append(tool_message)
        progress.response.append(tool_message)
        turn.checkpoint.add([tool_message])
        calls = []
        if terminated is not None:
            progress.finished = True
            progress.final_text = result_text(terminated)
            break
        failed_steps = failed_steps + 1 if all(r.error is not None for r in results) else 0
        if failed_steps >= agent.max_consecutive_tool_errors:
            raise ToolErrorLimit(agent.max_consecutive_tool_errors)
    return usage


def _instruct(turn: Turn) -> None:
    """The system message with the agent's instructions and what the harness adds now (the
    todo guidance, the current mode's rules): rebuilt per call, as `mode_set` changes it."""
    extra = turn.harness.instructions(turn.state.bag)
    text = turn.agent.instructions.strip() + (f"\n\n{extra}" if extra else "")
    turn.prompt[0] = msgspec.structs.replace(turn.prompt[0], contents=[TextContent(text=text)])


TERMINATED_ERROR: Final = "not executed: the tool loop was terminated"


def result_text(result: FunctionResultContent) -> str:
    """What a person reads of a result: its error, or its value (text as it is, else JSON)."""
    if result.error is not None:
        return result.error
    if isinstance(result.result, str):
        return result.result
    return msgspec.json.encode(result.result).decode()


async def run_tools(
    turn: Turn, calls: list[FunctionCallContent]
) -> tuple[list[FunctionResultContent], FunctionResultContent | None]:
    """Run a batch of calls in parallel; every call gets a result, in the batch's order.

    A `terminate` outcome stops the batch: calls already sent to their tool are awaited (they
    may have acted), calls still waiting for a person's approval get a "not executed" result,
    and the terminating result is returned to end the run.
    """
    waiting: set[str] = set()
    tasks = [asyncio.ensure_future(_call_tool(turn, c, waiting)) for c in calls]
    terminated: FunctionResultContent | None = None
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                invoked = task.result()
                if invoked.outcome == "terminate" and terminated is None:
                    terminated = invoked.result
            if terminated is not None:
                for task, call in zip(tasks, calls, strict=True):
                    if task in pending and call.call_id in waiting:
                        task.cancel()
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    results = [
        FunctionResultContent(call_id=call.call_id, error=TERMINATED_ERROR)
        if task.cancelled()
        else task.result().result
        for task, call in zip(tasks, calls, strict=True)
    ]
    return results, terminated


async def _call_tool(turn: Turn, call: FunctionCallContent, waiting: set[str]) -> ToolInvoked:
    ports, ctx = turn.ports, turn.ctx
    if turn.harness.handles(call.name):
        return ToolInvoked(result=await turn.harness.call_tool(turn.state, call), untrusted=False)
    refused = refuse_unlisted(call, turn.agent)
    if refused is not None:
        return ToolInvoked(result=refused)
    invoked = await ports.invoke_tool(ctx, call)
    if invoked.outcome == "approval_required" and invoked.approval is not None:
        request = invoked.approval

        async def announce() -> None:
            await ports.emit(
                ctx,
                RunApprovalRequested(
                    run_id=ctx.run_id,
                    call_id=call.call_id,
                    tool=request.tool,
                    arguments=request.arguments,
                    reason=request.reason,
                    expires_at=request.expires_at,
                ),
                event_id=f"approval-{call.call_id}",
            )

        waiting.add(call.call_id)
        grant = await ports.await_approval(ctx, call, request, announce)
        waiting.discard(call.call_id)
        invoked = await ports.invoke_tool(ctx, call, approval=grant)
    return invoked
