"""Whether a compaction could change the prompt at all, decided without the hop: while the
prompt is under every trigger of the agent's policy, the compaction service would hand it back
unchanged, so the gateway does not ask.

Conservative by construction: sizes are upper bounds (a token is at least one byte, for both
tokenizers), and a trigger this module cannot bound is taken to hold.
"""

from typing import assert_never

import msgspec

from runbus.messages import ChatMessage
from runbus.messages.compaction import (
    AllOf,
    Always,
    AnyOf,
    CompactionStrategy,
    ContextWindowCompaction,
    GroupsExceed,
    HasToolCalls,
    MessagesExceed,
    Never,
    NoCompaction,
    PipelineCompaction,
    SlidingWindowCompaction,
    SummarizationCompaction,
    TokensBelow,
    TokensExceed,
    ToolResultCompaction,
    Trigger,
    TruncationCompaction,
    TurnsExceed,
)

from .agents import CompactionPolicy

MESSAGE_OVERHEAD: int = 4
"""Tokens a message's framing counts for in compaction's estimate."""

_ENCODER = msgspec.json.Encoder()


class PromptSize:
    """Upper bounds of what compaction measures on a prompt."""

    def __init__(self, prompt: list[ChatMessage]) -> None:
        self.messages = len(prompt)
        self.users = sum(1 for m in prompt if m.role == "user")
        """A turn starts at a user message: there are never more turns than these."""
        self.tokens = sum(MESSAGE_OVERHEAD + len(_ENCODER.encode(m.contents)) for m in prompt)
        self.has_tool_calls = any(m.function_calls for m in prompt)


def may_compact(policy: CompactionPolicy, prompt: list[ChatMessage]) -> bool:
    """False only when no trigger of `policy` can hold on `prompt`."""
    if not policy.enabled:
        return False
    size = PromptSize(prompt)
    if policy.max_tokens is not None and size.tokens > policy.max_tokens:
        return True
    return _strategy_may(policy.strategy, size)


def _strategy_may(strategy: CompactionStrategy, size: PromptSize) -> bool:
    match strategy:
        case NoCompaction():
            return False
        case PipelineCompaction(steps=steps):
            return any(_strategy_may(step, size) for step in steps)
        case ContextWindowCompaction():
            budget = strategy.max_context - strategy.max_output
            return size.tokens > strategy.tool_eviction_threshold * budget
        case (
            ToolResultCompaction()
            | SummarizationCompaction()
            | SlidingWindowCompaction()
            | TruncationCompaction()
        ):
            return _may_hold(strategy.trigger, size)
        case _:
            assert_never(strategy)


def _may_hold(trigger: Trigger, size: PromptSize) -> bool:
    match trigger:
        case Always() | TokensBelow():
            return True
        case Never():
            return False
        case TokensExceed(tokens=limit):
            return size.tokens > limit
        case MessagesExceed(messages=limit) | GroupsExceed(groups=limit):
            # Groups are never more than the messages they are made of.
            return size.messages > limit
        case TurnsExceed(turns=limit):
            return size.users > limit
        case HasToolCalls():
            return size.has_tool_calls
        case AllOf(of=conditions):
            return all(_may_hold(c, size) for c in conditions)
        case AnyOf(of=conditions):
            return any(_may_hold(c, size) for c in conditions)
        case _:
            assert_never(trigger)
