"""Compaction service request and reply (`runbus.compaction.compact`)."""

from typing import Literal

import msgspec

from ._base import Message, Record
from .chat import ChatMessage

GroupKind = Literal["system", "user", "assistant_text", "tool_call", "summary"]


class MessageGroup(Record, frozen=True):
    kind: GroupKind
    """What the group is; a `tool_call` group holds the call and every result answering it."""
    start: int
    """Index of the group's first message in the prompt."""
    count: int
    """Messages in the group."""
    tokens: int
    """Estimated tokens."""


class CompactRequest(Message, frozen=True, tag="compaction.compact"):
    messages: list[ChatMessage]
    """The prompt copy to shrink; persisted history is never touched."""
    max_tokens: int | None = None
    """Budget for the prompt; None means no budget, only the estimate is returned."""


class CompactResult(Message, frozen=True, tag="compaction.result"):
    messages: list[ChatMessage]
    """What the model should see."""
    groups: list[MessageGroup]
    """The groups of `messages` with their token estimates."""
    total_tokens: int
    """Sum of the group estimates."""
    compacted: bool
    """True if anything was removed or summarised."""


COMPACT_REQUEST_DECODER = msgspec.json.Decoder(CompactRequest)
COMPACT_RESULT_DECODER = msgspec.json.Decoder(CompactResult)
