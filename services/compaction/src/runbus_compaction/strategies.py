"""The compaction strategies, without a bus: each removes one unit at a time (a group, a turn, a
tool-call group) oldest first and re-checks its target, never crossing its floor.

The summary call is the one thing that leaves the process; it comes in as a `Summarize`
function, so this module is tested with a plain async function and served over the model router.
"""

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, assert_never

import msgspec
import structlog

from runbus.errors import RunbusError
from runbus.messages import ChatMessage, MessageGroup, TextContent, Usage
from runbus.messages.compaction import (
    CompactionReport,
    CompactionStep,
    CompactionStrategy,
    ContextWindowCompaction,
    NoCompaction,
    PipelineCompaction,
    SlidingWindowCompaction,
    SummarizationCompaction,
    TokensExceed,
    ToolResultCompaction,
    TruncationCompaction,
)
from runbus.messages.contents import (
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    UriContent,
    UsageContent,
)
from runbus.messages.errors import ErrorInfo

from .core import MessageIndex
from .errors import EmptyPrompt, InvalidStrategy
from .tokens import BYTES, TokenCounter, result_text
from .triggers import holds

log = structlog.get_logger()

NO_COMPACTION: Final = NoCompaction()

DEFAULT_SUMMARY_INSTRUCTIONS: Final = """\
Summarise the conversation you are given so an assistant can carry on from it. Keep what the \
user asked for, decided and prefers, the facts and numbers the tools returned, and anything still \
open. Leave out greetings and repetition. Write plain, short sentences; never add facts."""
SUMMARY_REQUEST: Final = "Summarize the conversation above concisely."
SUMMARY_UNAVAILABLE: Final = "[Summary unavailable]"
TRANSCRIPT_PART_CHARS: Final = 2000
"""Characters of one part the summariser reads; a 5 MB tool output must not overflow it."""

_JSON: Final = msgspec.json.Encoder()


@dataclass(frozen=True)
class SummaryCall:
    route: str
    """Model route to ask."""
    messages: list[ChatMessage]
    """The summariser's prompt: instructions, then the transcript as one user message."""
    timeout: float
    """Seconds to wait at most."""


@dataclass(frozen=True)
class SummaryReply:
    text: str
    usage: Usage = field(default_factory=Usage)


Summarize = Callable[[SummaryCall], Awaitable[SummaryReply]]
"""Ask a model for a summary; raises a `RunbusError` when the call fails."""


@dataclass(frozen=True)
class Compaction:
    messages: list[ChatMessage]
    """What the model should see."""
    groups: list[MessageGroup]
    """The groups of `messages`."""
    report: CompactionReport

    @property
    def compacted(self) -> bool:
        return any(step.compacted for step in self.report.steps)

    @property
    def total_tokens(self) -> int:
        return self.report.tokens_after


def validate(strategy: CompactionStrategy) -> CompactionStrategy:
    """The spec checked against its wire constraints, however it was built."""
    try:
        checked: CompactionStrategy = msgspec.convert(
            msgspec.to_builtins(strategy), CompactionStrategy
        )
    except msgspec.ValidationError as exc:
        raise InvalidStrategy(str(exc)) from None
    return checked


def budget(max_tokens: int) -> PipelineCompaction:
    """The legacy `max_tokens` budget: collapse old tool results, then drop the oldest groups."""
    over = TokensExceed(tokens=max_tokens)
    return PipelineCompaction(
        steps=[ToolResultCompaction(trigger=over), TruncationCompaction(trigger=over)]
    )


def context_window_phases(
    spec: ContextWindowCompaction,
) -> tuple[ToolResultCompaction, TruncationCompaction]:
    """MAF's budget strategy as its two phases, from the model's window and output reserve."""
    input_budget = spec.max_context - spec.max_output
    return (
        ToolResultCompaction(
            trigger=TokensExceed(tokens=int(input_budget * spec.tool_eviction_threshold)),
            minimum_preserved=spec.minimum_preserved,
        ),
        TruncationCompaction(
            trigger=TokensExceed(tokens=int(input_budget * spec.truncation_threshold)),
            minimum_preserved=spec.minimum_preserved,
        ),
    )


async def compact(
    messages: list[ChatMessage],
    strategy: CompactionStrategy = NO_COMPACTION,
    *,
    counter: TokenCounter = BYTES,
    summarize: Summarize | None = None,
    max_tokens: int | None = None,
) -> Compaction:
    """Apply `strategy` to a copy of the prompt; the result is always a valid provider list."""
    if not messages:
        raise EmptyPrompt()
    strategy = validate(strategy)
    name = tag(strategy)
    if max_tokens is not None and isinstance(strategy, NoCompaction):
        if max_tokens < 0:
            raise InvalidStrategy(
                f"max_tokens is {max_tokens}; it must be >= 0", field="max_tokens"
            )
        strategy, name = budget(max_tokens), "max_tokens"
    index = MessageIndex.build(messages, counter)
    groups_before, messages_before, tokens_before = index.group_count, index.messages, index.tokens
    run = _Run(index, summarize)
    await run.apply(strategy, "$")
    output = index.output()
    input_ids = {m.message_id for m in messages}
    output_ids = {m.message_id for m in output}
    report = CompactionReport(
        strategy=name,
        tokenizer=counter.name,
        steps=run.steps,
        groups_before=groups_before,
        groups_after=index.group_count,
        messages_before=messages_before,
        messages_after=index.messages,
        tokens_before=tokens_before,
        tokens_after=index.tokens,
        excluded_message_ids=[
            i for i in dict.fromkeys(m.message_id for m in messages) if i and i not in output_ids
        ],
        added_message_ids=[
            m.message_id
            for m in output
            if m.source == "compaction" and m.message_id not in input_ids
        ],
        repaired_message_ids=index.repaired_ids,
        usage=run.usage,
    )
    return Compaction(messages=output, groups=index.wire_groups(), report=report)


def tag(strategy: CompactionStrategy) -> str:
    return str(type(strategy).__struct_config__.tag)


Reached = Callable[[], bool]

Step = (
    ToolResultCompaction | SummarizationCompaction | SlidingWindowCompaction | TruncationCompaction
)


class _Run:
    def __init__(self, index: MessageIndex, summarize: Summarize | None) -> None:
        self.index = index
        self.summarize = summarize
        self.steps: list[CompactionStep] = []
        self.usage = Usage()

    async def apply(self, strategy: CompactionStrategy, path: str) -> None:
        match strategy:
            case NoCompaction():
                pass
            case PipelineCompaction(steps=steps):
                for number, step in enumerate(steps):
                    await self.apply(step, f"{path}.steps[{number}]")
            case ContextWindowCompaction():
                tool_results, truncation = context_window_phases(strategy)
                await self.apply(tool_results, f"{path}.tool_result")
                await self.apply(truncation, f"{path}.truncation")
            case (
                ToolResultCompaction()
                | SummarizationCompaction()
                | SlidingWindowCompaction()
                | TruncationCompaction()
            ):
                await self.step(strategy, path)
            case _:
                assert_never(strategy)

    async def step(self, spec: Step, path: str) -> None:
        index = self.index
        before = (index.group_count, index.messages, index.tokens)

        def reached() -> bool:
            if spec.target is not None:
                return holds(spec.target, index)
            return not holds(spec.trigger, index)

        # With one non-system group or none there is nothing to weigh against anything else.
        triggered = index.non_system_groups > 1 and holds(spec.trigger, index)
        compacted, error = False, None
        if triggered:
            match spec:
                case ToolResultCompaction():
                    compacted = collapse_tool_results(index, spec, reached)
                case SlidingWindowCompaction():
                    compacted = slide_window(index, spec.minimum_preserved, reached)
                case TruncationCompaction():
                    compacted = truncate(index, spec.minimum_preserved, reached)
                case SummarizationCompaction():
                    compacted, error = await self.summarise(spec, reached)
                case _:
                    assert_never(spec)
        self.steps.append(
            CompactionStep(
                strategy=tag(spec),
                path=path,
                triggered=triggered,
                compacted=compacted,
                target_reached=reached(),
                groups_before=before[0],
                groups_after=index.group_count,
                messages_before=before[1],
                messages_after=index.messages,
                tokens_before=before[2],
                tokens_after=index.tokens,
                error=error,
            )
        )

    async def summarise(
        self, spec: SummarizationCompaction, reached: Reached
    ) -> tuple[bool, ErrorInfo | None]:
        """Mark the oldest groups until the target holds, then replace them with one summary;
        if the call fails, unmark them: the prompt is as it was."""
        index = self.index
        marked: list[int] = []
        for slot in _removable(index, spec.minimum_preserved):
            index.exclude(slot)
            marked.append(slot)
            if reached():
                break
        if not marked:
            return False, None
        summarised = [m for slot in marked for m in index.groups[slot].messages]
        call = SummaryCall(
            route=spec.route,
            messages=summary_prompt(summarised, spec.instructions),
            timeout=spec.timeout,
        )
        try:
            if self.summarize is None:
                raise RunbusError("no summariser is configured")
            reply = await self.summarize(call)
        except Exception as exc:
            if isinstance(exc, RunbusError):
                error = exc.to_info()
            else:
                log.exception("summary_call_failed", route=spec.route)
                error = ErrorInfo(code="internal", message=f"summary call failed ({exc!r})")
            for slot in marked:
                index.include(slot)
            return False, error
        self.usage += reply.usage
        text = reply.text.strip() or SUMMARY_UNAVAILABLE
        first = index.groups[marked[0]]
        message = _compaction_message(f"[Summary]\n{text}", "summary", summarised)
        index.replace(marked[0], index.new_group("summary", [message], first.turn))
        return True, None


def _newest(index: MessageIndex, count: int) -> set[int]:
    """Slots of the newest `count` included non-system groups: the floor."""
    protected: set[int] = set()
    for slot in range(len(index.groups) - 1, -1, -1):
        if len(protected) >= count:
            break
        group = index.groups[slot]
        if not group.excluded and group.kind != "system":
            protected.add(slot)
    return protected


def _removable(index: MessageIndex, minimum_preserved: int) -> list[int]:
    """Slots a strategy may take, oldest first: included, not system, not turn 0, not within
    the newest `minimum_preserved`."""
    protected = _newest(index, minimum_preserved)
    return [
        slot
        for slot, group in enumerate(index.groups)
        if not group.excluded and group.removable and slot not in protected
    ]


def truncate(index: MessageIndex, minimum_preserved: int, reached: Reached) -> bool:
    compacted = False
    for slot in _removable(index, minimum_preserved):
        index.exclude(slot)
        compacted = True
        if reached():
            break
    return compacted


def slide_window(index: MessageIndex, minimum_preserved_turns: int, reached: Reached) -> bool:
    """Drop whole turns, oldest first, keeping the newest `minimum_preserved_turns` turns."""
    by_turn: dict[int, list[int]] = {}
    for slot, group in enumerate(index.groups):
        if not group.excluded and group.removable and group.turn is not None:
            by_turn.setdefault(group.turn, []).append(slot)
    turns = sorted(by_turn)
    droppable = turns[: max(0, len(turns) - minimum_preserved_turns)]
    compacted = False
    for turn in droppable:
        for slot in by_turn[turn]:
            index.exclude(slot)
        compacted = True
        if reached():
            break
    return compacted


def collapse_tool_results(
    index: MessageIndex, spec: ToolResultCompaction, reached: Reached
) -> bool:
    compacted = False
    for slot in _removable(index, spec.minimum_preserved):
        group = index.groups[slot]
        if group.kind != "tool_call":
            continue
        text = tool_calls_summary(group.messages, spec.max_result_chars)
        message = _compaction_message(text, "tools", group.messages)
        index.replace(slot, index.new_group("summary", [message], group.turn))
        compacted = True
        if reached():
            break
    return compacted


def tool_calls_summary(messages: list[ChatMessage], max_result_chars: int | None) -> str:
    """`[Tool Calls]`, then each tool name (first-seen order) with its results as a list."""
    results = {r.call_id: result_text(r) for m in messages for r in m.function_results}
    by_name: dict[str, list[str]] = {}
    for message in messages:
        for call in message.function_calls:
            found = by_name.setdefault(call.name, [])
            result = results.get(call.call_id, "")
            if result:
                found.append(_cut(result, max_result_chars).replace("\n", "\n    "))
    lines = ["[Tool Calls]"]
    for name, found in by_name.items():
        lines.append(f"{name}:")
        lines.extend(f"  - {result}" for result in found)
    return "\n".join(lines)


def summary_prompt(messages: list[ChatMessage], instructions: str | None) -> list[ChatMessage]:
    return [
        ChatMessage(
            role="system",
            contents=[TextContent(text=instructions or DEFAULT_SUMMARY_INSTRUCTIONS)],
            source="compaction",
        ),
        ChatMessage(
            role="user",
            contents=[TextContent(text=f"{transcript(messages)}\n\n{SUMMARY_REQUEST}")],
            source="compaction",
        ),
    ]


def transcript(messages: list[ChatMessage]) -> str:
    """The conversation as lines a summariser reads; reasoning is left out."""
    names = {c.call_id: c.name for m in messages for c in m.function_calls}
    lines: list[str] = []
    for message in messages:
        for part in message.contents:
            match part:
                case TextContent(text=text) if text.strip():
                    lines.append(f"{message.role}: {_cut(text, TRANSCRIPT_PART_CHARS)}")
                case FunctionCallContent(name=name, arguments=arguments):
                    call = f"{name}({_JSON.encode(arguments).decode()})"
                    lines.append(f"{message.role} called {_cut(call, TRANSCRIPT_PART_CHARS)}")
                case FunctionResultContent(call_id=call_id):
                    result = _cut(result_text(part), TRANSCRIPT_PART_CHARS)
                    outcome = "failed" if part.error is not None else "returned"
                    lines.append(f"tool {names.get(call_id, call_id)} {outcome}: {result}")
                case UriContent(uri=uri):
                    lines.append(f"{message.role}: <{uri}>")
                case DataContent(media_type=media_type, data=data):
                    lines.append(f"{message.role}: [{media_type}, {len(data)} bytes]")
                case TextContent() | ReasoningContent() | UsageContent():
                    pass  # blank text, reasoning and usage are not the conversation
                case _:
                    assert_never(part)
    return "\n".join(lines)


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[:limit] + "…"


def _compaction_message(text: str, kind: str, replaced: list[ChatMessage]) -> ChatMessage:
    """An assistant message compaction wrote; its id derives from what it replaces, so the same
    prompt compacts to the same ids (history stores each id once)."""
    digest = hashlib.sha256(kind.encode())
    for message in replaced:
        digest.update(b"\0")
        digest.update(message.message_id.encode() if message.message_id else _JSON.encode(message))
    return ChatMessage(
        role="assistant",
        contents=[TextContent(text=text)],
        message_id=f"compaction-{kind}-{digest.hexdigest()[:16]}",
        created_at=replaced[0].created_at,
        source="compaction",
    )
