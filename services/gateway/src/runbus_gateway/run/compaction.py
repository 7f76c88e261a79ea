"""The compaction of a step's prompt copy: skipped without a hop while no trigger of the agent's
policy can hold, and, with `persist`, what it made of the history stored with the checkpoint.

Whether a trigger can hold is decided on upper bounds (a token is at least one byte, for both
tokenizers) with the compaction service's own rules (`runbus.compaction_triggers`); a trigger
that cannot be bounded is taken to hold.
"""

from typing import assert_never

import msgspec

from runbus.compaction_triggers import holds
from runbus.messages import ChatMessage
from runbus.messages.compaction import (
    CompactionStrategy,
    CompactResult,
    ContextWindowCompaction,
    NoCompaction,
    PipelineCompaction,
    SlidingWindowCompaction,
    SummarizationCompaction,
    ToolResultCompaction,
    TruncationCompaction,
)
from runbus.messages.history import HistoryCompaction

from ..agents import CompactionPolicy
from .checkpoints import Checkpointer
from .events import RunEvents
from .ports import RunPorts
from .state import message_id

MESSAGE_OVERHEAD: int = 4
"""Tokens a message's framing counts for in compaction's estimate."""

_ENCODER = msgspec.json.Encoder()


class PromptSize:
    """Upper bounds of what compaction measures on a prompt (`runbus.compaction_triggers`)."""

    def __init__(self, prompt: list[ChatMessage]) -> None:
        self.messages = len(prompt)
        self.group_count = self.messages
        """Groups are never more than the messages they are made of."""
        self.users = sum(1 for m in prompt if m.role == "user")
        """A turn starts at a user message: there are never more turns than these."""
        self.turns = self.users
        self.tokens = sum(MESSAGE_OVERHEAD + len(_ENCODER.encode(m.contents)) for m in prompt)
        self.tool_call_groups = sum(1 for m in prompt if m.function_calls)


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
            return holds(strategy.trigger, size, upper_bounds=True)
        case _:
            assert_never(strategy)


async def compact_prompt(
    ports: RunPorts,
    events: RunEvents,
    policy: CompactionPolicy,
    prompt: list[ChatMessage],
    step: int,
    checkpoints: Checkpointer | None = None,
) -> list[ChatMessage]:
    """The prompt copy the model sees; with `persist`, what it made of the history is also
    stored, and the run goes on from it. The hop is skipped while no trigger of the agent's
    policy can hold (or it has none): the prompt is already a valid provider list (history
    repairs what it loads)."""
    if not may_compact(policy, prompt):
        return prompt
    ctx = events.ctx
    compacted = await ports.compact(ctx, prompt, policy)
    persisted = persisted_compaction(compacted, ctx.run_id) if policy.persist else None
    stored = persisted is not None and checkpoints is not None and checkpoints.persist(persisted)
    first = compacted.messages[0].message_id if compacted.messages else None
    if stored and first == prompt[0].message_id:
        # History holds the session compacted now: the run's later steps go on from that,
        # as the next run will, instead of compacting the same history again at each step
        # (a hop and a `run.compacted` event per step of every run of a long session). The
        # instructions stay first (the step writes them in place).
        prompt[:] = compacted.messages
    if compacted.compacted or any(s.error for s in compacted.report.steps):
        await events.compacted(step, compacted.report)
    return compacted.messages


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
