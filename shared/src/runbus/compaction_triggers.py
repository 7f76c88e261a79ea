"""When a compaction trigger holds, given a prompt's measures: one set of rules for the
compaction service (exact measures of the groups still included) and the gateway (upper bounds
of a whole prompt, to skip the hop while no trigger can hold)."""

from typing import Protocol, assert_never

from .messages.compaction import (
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


class Measures(Protocol):
    """What triggers look at in a prompt."""

    @property
    def tokens(self) -> int: ...

    @property
    def messages(self) -> int: ...

    @property
    def turns(self) -> int:
        """User turns (turn 0, before the first user message, is not one)."""
        ...

    @property
    def group_count(self) -> int: ...

    @property
    def tool_call_groups(self) -> int: ...


def holds(trigger: Trigger, measures: Measures, *, upper_bounds: bool = False) -> bool:
    """Whether `trigger` holds on `measures`. With `upper_bounds` the measures are bounds from
    above: True then means the trigger may hold, and a trigger no upper bound can rule out
    (`tokens_below`) is taken to hold."""
    match trigger:
        case Always():
            return True
        case Never():
            return False
        case TokensExceed(tokens=limit):
            return measures.tokens > limit
        case TokensBelow(tokens=limit):
            return upper_bounds or measures.tokens < limit
        case MessagesExceed(messages=limit):
            return measures.messages > limit
        case TurnsExceed(turns=limit):
            return measures.turns > limit
        case GroupsExceed(groups=limit):
            return measures.group_count > limit
        case HasToolCalls():
            return measures.tool_call_groups > 0
        case AllOf(of=conditions):
            return all(holds(c, measures, upper_bounds=upper_bounds) for c in conditions)
        case AnyOf(of=conditions):
            return any(holds(c, measures, upper_bounds=upper_bounds) for c in conditions)
        case _:
            assert_never(trigger)
