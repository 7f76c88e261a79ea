"""Compaction service request and reply (`runbus.compaction.compact`), the strategy spec and the
report of what a compaction did.

The strategy spec is the same value on the wire (JSON) and in an agent's `[compaction]` TOML table
(`strategy_from_config`). It is a tagged union twice over: a strategy is tagged by `strategy`, a
trigger or target by `condition`, e.g.
`{strategy = "truncation", trigger = {condition = "tokens_exceed", tokens = 8000}}`.
"""

from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal

import msgspec

from ._base import Message, Record
from .chat import ChatMessage, Usage
from .errors import ErrorInfo

GroupKind = Literal["system", "user", "assistant_text", "tool_call", "summary"]

Count = Annotated[int, msgspec.Meta(ge=0)]
"""A threshold or a number of groups/turns: never negative."""

Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
"""A share of a token budget, in (0, 1]."""

Tokenizer = Literal["bytes", "cl100k"]
"""How tokens are counted: `bytes` (UTF-8 bytes / 4, no tables) or `cl100k` (OpenAI's
cl100k_base BPE, shipped inside the service's wheel; nothing is downloaded)."""


class MessageGroup(Record, frozen=True):
    kind: GroupKind
    """What the group is; a `tool_call` group holds the call and every result answering it."""
    start: int
    """Index of the group's first message in the prompt."""
    count: int
    """Messages in the group."""
    tokens: int
    """Estimated tokens."""
    bytes: int = 0
    """UTF-8 bytes of what the model reads of the group's content parts."""
    turn: int | None = None
    """User turn the group belongs to: 1 for the first user message and what follows it, 0 for
    anything before the first user message; None for system messages, which have no turn."""


# Triggers and targets -------------------------------------------------------------------------


class Condition(msgspec.Struct, kw_only=True, frozen=True, tag_field="condition"):
    """A predicate on the groups a compaction still includes: a strategy's trigger (when it
    starts) or target (when it stops)."""


class Always(Condition, frozen=True, tag="always"):
    """Always holds."""


class Never(Condition, frozen=True, tag="never"):
    """Never holds: a strategy with this trigger does nothing."""


class TokensExceed(Condition, frozen=True, tag="tokens_exceed"):
    tokens: Count
    """Holds while the included groups' estimated tokens are more than this."""


class TokensBelow(Condition, frozen=True, tag="tokens_below"):
    tokens: Count
    """Holds while the included groups' estimated tokens are fewer than this."""


class MessagesExceed(Condition, frozen=True, tag="messages_exceed"):
    messages: Count
    """Holds while the included messages are more than this."""


class TurnsExceed(Condition, frozen=True, tag="turns_exceed"):
    turns: Count
    """Holds while the included user turns (turn 0 not counted) are more than this."""


class GroupsExceed(Condition, frozen=True, tag="groups_exceed"):
    groups: Count
    """Holds while the included groups (system groups too) are more than this."""


class HasToolCalls(Condition, frozen=True, tag="has_tool_calls"):
    """Holds while a `tool_call` group is included."""


class AllOf(Condition, frozen=True, tag="all"):
    of: "Annotated[list[Trigger], msgspec.Meta(min_length=1)]"
    """Holds when every one of these holds."""


class AnyOf(Condition, frozen=True, tag="any"):
    of: "Annotated[list[Trigger], msgspec.Meta(min_length=1)]"
    """Holds when at least one of these holds."""


Trigger = (
    Always
    | Never
    | TokensExceed
    | TokensBelow
    | MessagesExceed
    | TurnsExceed
    | GroupsExceed
    | HasToolCalls
    | AllOf
    | AnyOf
)


# Strategies -----------------------------------------------------------------------------------


class Strategy(msgspec.Struct, kw_only=True, frozen=True, tag_field="strategy"):
    """How to shrink the prompt. Every strategy but `none`, `pipeline` and `context_window` has
    a `trigger` (checked once, before it starts), an optional `target` (checked after each unit
    it removes; default: the trigger no longer holds) and a `minimum_preserved` floor it never
    crosses even if the target is not reached."""


class NoCompaction(Strategy, frozen=True, tag="none"):
    """Leave the prompt as it is (only repaired into a valid provider message list)."""


class ToolResultCompaction(Strategy, frozen=True, tag="tool_result"):
    """Collapse old `tool_call` groups, oldest first, into one assistant message each:
    `[Tool Calls]` then each tool name with its results (first-seen order). No model call."""

    trigger: Trigger
    """When to start."""
    target: Trigger | None = None
    """When to stop; None: as soon as the trigger no longer holds."""
    minimum_preserved: Count = 2
    """The newest non-system groups that are never collapsed."""
    max_result_chars: Count | None = 500
    """Characters of each result kept in the collapsed message (cut with `…`); None keeps all."""


class SummarizationCompaction(Strategy, frozen=True, tag="summarization"):
    """Summarise the oldest groups with one model call through the model router; the summary
    replaces them as one assistant message `[Summary]\\n…` where the first of them was."""

    trigger: Trigger
    """When to start."""
    target: Trigger | None = None
    """When to stop marking groups for the summary; None: the trigger no longer holds."""
    minimum_preserved: Count = 4
    """The newest non-system groups that are never summarised."""
    route: Annotated[str, msgspec.Meta(min_length=1)] = "cheap"
    """Model route the summary is asked of (`runbus.model.complete`); a small, cheap model."""
    instructions: str | None = None
    """System prompt of the summary call; None uses the service's default."""
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    """Seconds to wait for the summary (at most half the run's time left); on a timeout the
    prompt stays as it was and the failure is reported."""


class SlidingWindowCompaction(Strategy, frozen=True, tag="sliding_window"):
    """Drop the oldest user turns, whole turns only, e.g. with `turns_exceed(8)` as trigger."""

    trigger: Trigger
    """When to start."""
    target: Trigger | None = None
    """When to stop; None: as soon as the trigger no longer holds."""
    minimum_preserved: Count = 1
    """The newest user turns that are never dropped (turns, not groups)."""


class TruncationCompaction(Strategy, frozen=True, tag="truncation"):
    """Drop the oldest non-system groups: the last-resort fuse."""

    trigger: Trigger
    """When to start."""
    target: Trigger | None = None
    """When to stop; None: as soon as the trigger no longer holds."""
    minimum_preserved: Count = 2
    """The newest non-system groups that are never dropped."""


class PipelineCompaction(Strategy, frozen=True, tag="pipeline"):
    """Run the steps in order, each checking its own trigger on what the previous left."""

    steps: "Annotated[list[CompactionStrategy], msgspec.Meta(min_length=1)]"
    """Strategies to run, mildest first (tool results, summary, window, truncation)."""


class ContextWindowCompaction(Strategy, frozen=True, tag="context_window"):
    """A budget from the model's window: input budget = `max_context - max_output`; collapse
    tool results above `tool_eviction_threshold` of it, truncate above `truncation_threshold`."""

    max_context: Annotated[int, msgspec.Meta(gt=0)]
    """Tokens the model's context window holds."""
    max_output: Count = 0
    """Tokens reserved for the reply; less than `max_context`."""
    tool_eviction_threshold: Fraction = 0.5
    """Share of the input budget above which old tool results are collapsed."""
    truncation_threshold: Fraction = 0.8
    """Share of the input budget above which the oldest groups are dropped; at least
    `tool_eviction_threshold`."""
    minimum_preserved: Count = 2
    """The newest non-system groups neither phase touches."""

    def __post_init__(self) -> None:
        if self.max_output >= self.max_context:
            raise ValueError(
                f"max_output ({self.max_output}) must be less than max_context ({self.max_context})"
            )
        if self.truncation_threshold < self.tool_eviction_threshold:
            raise ValueError(
                f"truncation_threshold ({self.truncation_threshold}) must be at least "
                f"tool_eviction_threshold ({self.tool_eviction_threshold})"
            )


CompactionStrategy = (
    NoCompaction
    | ToolResultCompaction
    | SummarizationCompaction
    | SlidingWindowCompaction
    | TruncationCompaction
    | PipelineCompaction
    | ContextWindowCompaction
)


# Report ---------------------------------------------------------------------------------------


class CompactionStep(Record, frozen=True):
    """What one strategy of the spec did."""

    strategy: str
    """Tag of the strategy, e.g. `tool_result`."""
    path: str
    """Where it sits in the spec: `$`, `$.steps[1]`, `$.truncation` (a context_window phase)."""
    triggered: bool
    """The trigger held (and more than one non-system group was included)."""
    compacted: bool
    """It removed, collapsed or summarised at least one group."""
    target_reached: bool
    """Its target held when it stopped (false when the floor stopped it first)."""
    groups_before: int
    groups_after: int
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    error: ErrorInfo | None = None
    """Why it changed nothing although triggered (a failed summary call); None otherwise."""


class CompactionReport(Record, frozen=True):
    """What a compaction did; also the body a `run.compacted` event can carry."""

    strategy: str = "none"
    """Tag of the strategy that ran; `max_tokens` for the legacy budget of `max_tokens`."""
    tokenizer: Tokenizer = "bytes"
    """How tokens were counted."""
    steps: list[CompactionStep] = []
    """Every strategy that was checked, in the order it ran."""
    groups_before: int = 0
    groups_after: int = 0
    messages_before: int = 0
    messages_after: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    excluded_message_ids: list[str] = []
    """Ids of prompt messages the model will not see (removed, collapsed or summarised)."""
    added_message_ids: list[str] = []
    """Ids of the messages compaction wrote (summaries, collapsed tool calls; `source` =
    `compaction`); derived from what they replace, so the same input gives the same ids."""
    repaired_message_ids: list[str] = []
    """Ids of messages changed to make the prompt a valid provider list: tool results without
    their call dropped, results moved next to their call, calls never answered dropped."""
    usage: Usage = Usage()
    """Tokens the summary calls used."""


# Request and reply ----------------------------------------------------------------------------


class CompactRequest(Message, frozen=True, tag="compaction.compact"):
    messages: list[ChatMessage]
    """The prompt copy to shrink (not empty); persisted history is never touched."""
    max_tokens: int | None = None
    """Legacy budget: with `strategy` = `none`, collapse tool results then truncate while the
    prompt is over this many tokens. Ignored when a strategy is given."""
    strategy: CompactionStrategy = NoCompaction()
    """How to compact; the default leaves the prompt as it is."""
    tokenizer: Tokenizer = "bytes"
    """How tokens are counted for triggers, targets and the report."""


class CompactResult(Message, frozen=True, tag="compaction.result"):
    messages: list[ChatMessage]
    """What the model should see: always a valid provider message list."""
    groups: list[MessageGroup]
    """The groups of `messages` with their token estimates."""
    total_tokens: int
    """Sum of the group estimates."""
    compacted: bool
    """True if anything was removed, collapsed or summarised."""
    report: CompactionReport = CompactionReport()
    """What was done, step by step."""


def strategy_from_config(
    table: Mapping[str, Any], *, ignore: Collection[str] = ()
) -> CompactionStrategy:
    """The strategy of an agent's `[compaction]` TOML table.

    Unlike the wire, config rejects keys it does not know (a typo must not silently turn
    compaction off); `ignore` names top-level keys the caller reads itself (e.g. `persist`).
    Raises `msgspec.ValidationError` naming the bad key or value.
    """
    raw = {k: v for k, v in table.items() if k not in ignore}
    strategy: CompactionStrategy = msgspec.convert(raw, CompactionStrategy)
    _reject_unknown_keys(raw, strategy, "$")
    return strategy


def _reject_unknown_keys(raw: Any, value: Any, path: str) -> None:
    if isinstance(value, msgspec.Struct) and isinstance(raw, Mapping):
        config = value.__struct_config__
        known = set(value.__struct_fields__) | {config.tag_field}
        for key in raw:
            if key not in known:
                raise msgspec.ValidationError(
                    f"Object contains unknown field `{key}` - at `{path}`"
                )
        for name in value.__struct_fields__:
            if name in raw:
                _reject_unknown_keys(raw[name], getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list) and isinstance(raw, list):
        for index, (raw_item, item) in enumerate(zip(raw, value, strict=True)):
            _reject_unknown_keys(raw_item, item, f"{path}[{index}]")
