"""Triggers and targets evaluated on the metrics of the groups a compaction still includes."""

from typing import assert_never

from runbus.messages.compaction import (
    AllOf,
    Always,
    AnyOf,
    GroupsExceed,
    HasToolCalls,
    MessagesExceed,
    Never,
    TokensBelow,
    TokensExceed,
    Trigger,
    TurnsExceed,
)

from .core import MessageIndex


def holds(condition: Trigger, index: MessageIndex) -> bool:
    match condition:
        case Always():
            return True
        case Never():
            return False
        case TokensExceed(tokens=limit):
            return index.tokens > limit
        case TokensBelow(tokens=limit):
            return index.tokens < limit
        case MessagesExceed(messages=limit):
            return index.messages > limit
        case TurnsExceed(turns=limit):
            return index.turns > limit
        case GroupsExceed(groups=limit):
            return index.group_count > limit
        case HasToolCalls():
            return index.tool_call_groups > 0
        case AllOf(of=conditions):
            return all(holds(c, index) for c in conditions)
        case AnyOf(of=conditions):
            return any(holds(c, index) for c in conditions)
        case _:
            assert_never(condition)
