"""Message groups: the units compaction keeps, collapses or drops, and their running metrics.

A `tool_call` group holds the assistant message with function calls, every tool message that
answers one of them (matched by call_id, even when it arrived later) and the reasoning-only
assistant messages right before or after the call, so no strategy can split a call from its
result. Building the index also repairs what a provider would reject: a result without its call is
dropped, a late result moves next to its call, and a call never answered is dropped.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import assert_never

import msgspec

from runbus.messages import ChatMessage, MessageGroup
from runbus.messages.compaction import GroupKind
from runbus.messages.contents import (
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    UsageContent,
)

from .tokens import BYTES, TokenCounter, measure


@dataclass(eq=False, slots=True)
class Group:
    kind: GroupKind
    messages: list[ChatMessage]
    turn: int | None
    """User turn (0 before the first user message); None for system groups."""
    bytes: int = 0
    tokens: int = 0
    excluded: bool = False

    @property
    def removable(self) -> bool:
        """Not a system group and not turn 0: a strategy may take it away."""
        return self.kind != "system" and self.turn != 0


@dataclass(eq=False)
class MessageIndex:
    """The groups of a prompt and the metrics of the included ones, kept up to date as
    strategies exclude and add groups, so every trigger check is O(1)."""

    groups: list[Group]
    counter: TokenCounter = BYTES
    repaired_ids: list[str] = field(default_factory=list)
    """Ids of input messages the build changed, moved or dropped."""
    tokens: int = 0
    messages: int = 0
    group_count: int = 0
    non_system_groups: int = 0
    tool_call_groups: int = 0
    _turns: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for group in self.groups:
            if not group.excluded:
                self._count(group, 1)

    @property
    def turns(self) -> int:
        """Included user turns; turn 0 (before the first user message) is not a turn."""
        return len(self._turns)

    def _count(self, group: Group, sign: int) -> None:
        self.tokens += sign * group.tokens
        self.messages += sign * len(group.messages)
        self.group_count += sign
        if group.kind != "system":
            self.non_system_groups += sign
        if group.kind == "tool_call":
            self.tool_call_groups += sign
        if group.turn:
            self._turns[group.turn] += sign
            if not self._turns[group.turn]:
                del self._turns[group.turn]

    def exclude(self, slot: int) -> None:
        group = self.groups[slot]
        if not group.excluded:
            group.excluded = True
            self._count(group, -1)

    def include(self, slot: int) -> None:
        group = self.groups[slot]
        if group.excluded:
            group.excluded = False
            self._count(group, 1)

    def replace(self, slot: int, group: Group) -> None:
        """Put `group` where the group at `slot` was (excluding that one)."""
        self.exclude(slot)
        self.groups[slot] = group
        self._count(group, 1)

    def new_group(self, kind: GroupKind, messages: list[ChatMessage], turn: int | None) -> Group:
        group = Group(kind, messages, turn)
        for message in messages:
            size, tokens = measure(message, self.counter)
            group.bytes += size
            group.tokens += tokens
        return group

    def included(self) -> list[Group]:
        return [g for g in self.groups if not g.excluded]

    def output(self) -> list[ChatMessage]:
        return [m for g in self.groups if not g.excluded for m in g.messages]

    def wire_groups(self) -> list[MessageGroup]:
        """The included groups as the reply describes them, indexed into `output()`."""
        groups, start = [], 0
        for g in self.included():
            groups.append(
                MessageGroup(
                    kind=g.kind,
                    start=start,
                    count=len(g.messages),
                    tokens=g.tokens,
                    bytes=g.bytes,
                    turn=g.turn,
                )
            )
            start += len(g.messages)
        return groups

    @classmethod
    def build(cls, messages: list[ChatMessage], counter: TokenCounter = BYTES) -> "MessageIndex":
        builder = _Builder()
        for message in messages:
            builder.add(message)
        groups = builder.finish()
        index = cls(groups=[], counter=counter, repaired_ids=builder.repaired)
        for group in groups:
            measured = index.new_group(group.kind, group.messages, group.turn)
            index.groups.append(measured)
            index._count(measured, 1)
        return index


def is_reasoning_only(message: ChatMessage) -> bool:
    return any(isinstance(p, ReasoningContent) for p in message.contents) and all(
        isinstance(p, ReasoningContent | UsageContent) for p in message.contents
    )


def _kind(message: ChatMessage) -> GroupKind:
    match message.role:
        case "system":
            return "system"
        case _ if message.source == "compaction":
            return "summary"
        case "user":
            return "user"
        case "assistant" | "tool":
            return "assistant_text"
        case _:
            assert_never(message.role)


class _Builder:
    """One forward pass over the prompt, grouping and repairing as it goes."""

    def __init__(self) -> None:
        self.groups: list[Group] = []
        self.turn = 0
        self.open_calls: dict[str, int] = {}
        """call_id → slot of the tool_call group still waiting for its result."""
        self.answered: dict[int, set[str]] = {}
        """tool_call slot → call ids answered so far."""
        self.in_tool_group = False
        """The last message added belongs to the newest group, a tool_call group."""
        self.pending_reasoning: list[ChatMessage] = []
        self.repaired: list[str] = []

    def add(self, message: ChatMessage) -> None:
        match message.role:
            case "tool":
                self._add_results(message)
            case "assistant" if message.function_calls:
                self._add_calls(message)
            case "assistant" if is_reasoning_only(message):
                if self.in_tool_group:
                    self.groups[-1].messages.append(message)
                else:
                    self.pending_reasoning.append(message)
            case "user" | "system" | "assistant":
                self._flush_reasoning()
                if message.role == "user":
                    self.turn += 1
                kind = _kind(message)
                self.groups.append(Group(kind, [message], None if kind == "system" else self.turn))
                self.in_tool_group = False
            case _:
                assert_never(message.role)

    def _add_calls(self, message: ChatMessage) -> None:
        slot = len(self.groups)
        self.groups.append(Group("tool_call", [*self.pending_reasoning, message], self.turn))
        self.pending_reasoning = []
        self.answered[slot] = set()
        for call in message.function_calls:
            self.open_calls[call.call_id] = slot
        self.in_tool_group = True

    def _add_results(self, message: ChatMessage) -> None:
        by_slot: dict[int, list[object]] = {}
        others: list[object] = []
        for part in message.contents:
            if isinstance(part, FunctionResultContent):
                slot = self.open_calls.pop(part.call_id, None)
                if slot is not None:
                    by_slot.setdefault(slot, []).append(part)
                    self.answered[slot].add(part.call_id)
            elif not isinstance(part, UsageContent):
                others.append(part)
        if not by_slot:
            self._repaired(message)  # nothing here answers a call: a provider would reject it
            return
        slots = sorted(by_slot)
        if others:
            by_slot[slots[0]].extend(others)
        if len(slots) > 1 or sum(map(len, by_slot.values())) != len(message.contents):
            self._repaired(message)
        for slot in slots:
            part_list = by_slot[slot]
            copy = (
                message
                if len(part_list) == len(message.contents)
                else msgspec.structs.replace(message, contents=part_list)
            )
            if slot == len(self.groups) - 1:
                self.groups[slot].messages.append(copy)
            else:
                _insert_result(self.groups[slot], copy)
                self._repaired(message)
        self.in_tool_group = slots[-1] == len(self.groups) - 1

    def _flush_reasoning(self) -> None:
        for message in self.pending_reasoning:
            self.groups.append(Group("assistant_text", [message], self.turn))
        self.pending_reasoning = []

    def _repaired(self, message: ChatMessage) -> None:
        if message.message_id and message.message_id not in self.repaired:
            self.repaired.append(message.message_id)

    def finish(self) -> list[Group]:
        self._flush_reasoning()
        groups: list[Group] = []
        for slot, group in enumerate(self.groups):
            if group.kind == "tool_call":
                groups.extend(self._drop_unanswered(group, self.answered[slot]))
            else:
                groups.append(group)
        return groups

    def _drop_unanswered(self, group: Group, answered: set[str]) -> list[Group]:
        """A call without a result is taken out of the message that made it; if no call of the
        group was answered, what is left of its messages stands as plain assistant text."""
        messages: list[ChatMessage] = []
        for message in group.messages:
            calls = message.function_calls
            if not calls or all(c.call_id in answered for c in calls):
                messages.append(message)
                continue
            self._repaired(message)
            kept = [
                p
                for p in message.contents
                if not isinstance(p, FunctionCallContent) or p.call_id in answered
            ]
            if any(not isinstance(p, UsageContent) for p in kept):
                messages.append(msgspec.structs.replace(message, contents=kept))
        if answered:
            return [Group("tool_call", messages, group.turn)]
        return [Group("assistant_text", [m], group.turn) for m in messages]


def _insert_result(group: Group, message: ChatMessage) -> None:
    """Put a late result right after the group's call and results, before any reasoning that
    followed them, so only tool messages stand between a call and its results."""
    position = max(i for i, m in enumerate(group.messages) if m.role == "tool" or m.function_calls)
    group.messages.insert(position + 1, message)


def group_messages(
    messages: list[ChatMessage], counter: TokenCounter = BYTES
) -> list[MessageGroup]:
    """The groups of the (repaired) prompt, as the reply describes them."""
    return MessageIndex.build(messages, counter).wire_groups()
