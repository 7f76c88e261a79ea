"""A step's tool calls: who may be called, in parallel, with approvals and terminate."""

import asyncio
import re
from typing import Final

import msgspec

from runbus.messages import FunctionCallContent, FunctionResultContent
from runbus.messages.memory import MEMORY_SEARCH_TOOL
from runbus.messages.tools import ToolInvoked

from .agents import AgentSpec
from .turn import Turn

TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


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


TERMINATED_ERROR: Final = "not executed: the tool loop was terminated"
UNWIND_WITHIN: Final = 5.0
"""Seconds a cancelled run waits for its tool calls' clean-up before it ends anyway."""


def result_text(result: FunctionResultContent) -> str:
    """What a person reads of a result: its error, or its value (text as it is, else JSON)."""
    if result.error is not None:
        return result.error
    if isinstance(result.result, str):
        return result.result
    return msgspec.json.encode(result.result).decode()


async def run_tools(
    turn: Turn, calls: list[FunctionCallContent], *, first_send: bool = False
) -> tuple[list[FunctionResultContent], FunctionResultContent | None]:
    """Run a batch of calls in parallel; every call gets a result, in the batch's order.
    `first_send`: the calls come from a model reply of this run, never sent before.

    A `terminate` outcome stops the batch: calls already sent to their tool are awaited (they
    may have acted), calls still waiting for a person's approval get a "not executed" result,
    and the terminating result is returned to end the run.
    """
    waiting: set[str] = set()
    tasks = [asyncio.ensure_future(_call_tool(turn, c, waiting, first_send)) for c in calls]
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


async def _call_tool(
    turn: Turn, call: FunctionCallContent, waiting: set[str], first_send: bool
) -> ToolInvoked:
    ports, ctx = turn.ports, turn.ctx
    if turn.harness.handles(call.name):
        return ToolInvoked(result=await turn.harness.call_tool(turn.state, call), untrusted=False)
    refused = refuse_unlisted(call, turn.agent)
    if refused is not None:
        return ToolInvoked(result=refused)
    invoked = await ports.invoke_tool(ctx, call, first_send=first_send)
    if invoked.outcome == "approval_required" and invoked.approval is not None:
        request = invoked.approval

        async def announce() -> None:
            await turn.events.approval_requested(call.call_id, request)

        waiting.add(call.call_id)
        await turn.waiting(True)
        try:
            grant = await ports.await_approval(ctx, call, request, announce)
        finally:
            await turn.waiting(False)
        waiting.discard(call.call_id)
        # Asked for approval, the call was not run nor claimed: still a first send.
        invoked = await ports.invoke_tool(ctx, call, approval=grant, first_send=first_send)
    return invoked
