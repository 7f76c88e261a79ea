"""A tool call over the bus (`runbus.tools.<name>`): a call lost on the way is sent again, any
other failure is an error result the model reads."""

import asyncio
from typing import Final

import msgspec
import structlog

from runbus import ops
from runbus.bus import Bus
from runbus.errors import IdleTimeout, RemoteError, Unavailable
from runbus.headers import RunContext
from runbus.messages import FunctionCallContent, FunctionResultContent, ToolInvoke
from runbus.messages.tools import ApprovalGrant, ToolInvoked

from .catalog import ToolCatalogCache

TOOL_RETRY_PAUSES: Final = (0.2, 1.0)
"""Seconds before the second and the third try of a tool call lost on the way."""

log = structlog.get_logger()


def tool_retry_pause(exc: Exception, tries: int, time_left: float | None) -> float | None:
    """Seconds to wait before sending a failed tool call again after `tries` tries, or None
    when the model gets the error now.

    Only a call lost on the way goes again: its executor replica died or stalled, or NATS lost
    the request or the reply (`IdleTimeout`), or NATS did not answer the executor in time (a
    remote `unavailable`). The same call id again is safe: the executor runs a side-effecting
    call at most once and answers a repeat with the recorded result. A tool no replica serves
    (no responders) or one that refused the call is the model's to handle at once, and so is
    a call the run's deadline leaves no time to try again.
    """
    lost = isinstance(exc, IdleTimeout) or (
        isinstance(exc, RemoteError) and exc.known_code == Unavailable.code
    )
    if not lost or tries > len(TOOL_RETRY_PAUSES):
        return None
    pause = TOOL_RETRY_PAUSES[tries - 1]
    if time_left is not None and time_left <= pause:
        return None
    return pause


def owned_run(ctx: RunContext) -> str:
    """The run with its owner: what keys anything per run that another owner must not share."""
    return f"{ctx.prop('tenant')}.{ctx.prop('user_id')}.{ctx.run_id}"


async def invoke_tool(
    bus: Bus,
    catalog: ToolCatalogCache,
    ctx: RunContext,
    call: FunctionCallContent,
    approval: ApprovalGrant | None,
    first_send: bool,
) -> ToolInvoked:
    """The call's outcome; `first_send`: this run never sent the call before."""
    # A tool that is down or refuses the call is something the model can react to, so it
    # becomes an error result rather than a failed run; a call lost on the way is first
    # sent again (`tool_retry_pause`).
    invoke = ToolInvoke(
        call_id=call.call_id,
        name=call.name,
        arguments=call.arguments,
        approval=approval,
        first_send=first_send,
    )
    tries = 0
    while True:
        tries += 1
        try:
            return await bus.call(
                ops.TOOL_INVOKE.at(call.name),
                # Sent again, it may have reached an executor the first time.
                invoke if tries == 1 else msgspec.structs.replace(invoke, first_send=False),
                ctx=ctx,
                progress=True,  # a long tool is bounded by its own timeout, not the hop's
            )
        except (RemoteError, Unavailable) as exc:
            pause = tool_retry_pause(exc, tries, ctx.time_left())
            if pause is None:
                # The catalogue may offer a tool that is gone: ask again next run.
                catalog.forget(ctx.agent, ctx.prop("tenant"))
                return ToolInvoked(
                    result=FunctionResultContent(call_id=call.call_id, error=str(exc))
                )
            log.warning(
                "tool_call_sent_again", tool=call.name, call_id=call.call_id, error=str(exc)
            )
            await asyncio.sleep(pause)
