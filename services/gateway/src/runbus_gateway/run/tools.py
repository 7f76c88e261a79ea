"""A step's tool calls: each to the toolset that offers its name (none: refused), in parallel,
every call with a result in the batch's order; a `terminate` outcome ends the run."""

import asyncio
from collections.abc import Sequence
from typing import Final

import msgspec

from runbus.messages import FunctionCallContent, FunctionResultContent, ToolSpec, Usage
from runbus.messages.tools import ToolInvoked

from .agent_tools import AgentTools
from .toolsets import ClientTools, Toolset

TERMINATED_ERROR: Final = "not executed: the tool loop was terminated"
UNWIND_WITHIN: Final = 5.0
"""Seconds a cancelled run waits for its tool calls' clean-up before it ends anyway."""


class Toolsets:
    """The toolsets of one run, in the order their tools are offered."""

    def __init__(self, toolsets: Sequence[Toolset], waiting: set[str]) -> None:
        self.toolsets = list(toolsets)
        self.waiting = waiting
        """Ids of calls waiting for a person: not sent to any tool yet."""

    async def tools(self) -> list[ToolSpec]:
        """Every tool offered, asked of the toolsets at once."""
        offered = await asyncio.gather(*(t.tools() for t in self.toolsets))
        return [spec for specs in offered for spec in specs]

    def find(self, name: str) -> Toolset | None:
        return next((t for t in self.toolsets if t.handles(name)), None)

    async def hand_over(self, calls: Sequence[FunctionCallContent]) -> set[str]:
        """Record the calls that go to the client (its own tools, `ClientTools`) before the
        run's events show them; their ids."""
        handed = set()
        for call in calls:
            toolset = self.find(call.name)
            if isinstance(toolset, ClientTools):
                await toolset.hand_over(call)
                handed.add(call.call_id)
        return handed

    def child_usage(self) -> Usage:
        """Tokens of the child runs (other agents called as tools) the run waited on."""
        usage = Usage()
        for toolset in self.toolsets:
            if isinstance(toolset, AgentTools):
                usage += toolset.usage
        return usage

    def urgent(self, calls: Sequence[FunctionCallContent]) -> bool:
        """Whether the results of `calls` must be stored at once (`Toolset.urgent`)."""
        return any(t is not None and t.urgent for t in map(self.find, (c.name for c in calls)))

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        """The model may only call a tool some toolset of the run offers."""
        toolset = self.find(call.name)
        if toolset is None:
            error = f"no tool named {call.name[:64]!r} is available to this agent"
            return ToolInvoked(result=FunctionResultContent(call_id=call.call_id, error=error))
        return await toolset.call(call, first_send=first_send)


def result_text(result: FunctionResultContent) -> str:
    """What a person reads of a result: its error, or its value (text as it is, else JSON)."""
    if result.error is not None:
        return result.error
    if isinstance(result.result, str):
        return result.result
    return msgspec.json.encode(result.result).decode()


async def run_tools(
    toolsets: Toolsets, calls: list[FunctionCallContent], *, first_send: bool = False
) -> tuple[list[FunctionResultContent], FunctionResultContent | None]:
    """Run a batch of calls in parallel; every call gets a result, in the batch's order.
    `first_send`: the calls come from a model reply of this run, never sent before.

    A `terminate` outcome stops the batch: calls already sent to their tool are awaited (they
    may have acted), calls still waiting for a person's approval get a "not executed" result,
    and the terminating result is returned to end the run.
    """
    tasks = [asyncio.ensure_future(toolsets.call(c, first_send=first_send)) for c in calls]
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
                    if task in pending and call.call_id in toolsets.waiting:
                        task.cancel()
    except BaseException:
        for task in tasks:
            task.cancel()
        # Let them unwind first: a call's clean-up (its "no longer waiting" status) must not
        # land after the run's final record. Bounded, so a call that ignores its cancel
        # cannot hold the run's end up.
        if tasks:
            await asyncio.wait(tasks, timeout=UNWIND_WITHIN)
        raise
    results = [
        FunctionResultContent(call_id=call.call_id, error=TERMINATED_ERROR)
        if task.cancelled()
        else task.result().result
        for task, call in zip(tasks, calls, strict=True)
    ]
    return results, terminated
