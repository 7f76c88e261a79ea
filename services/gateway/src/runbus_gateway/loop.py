"""The run itself, without a bus: one function from request to `run.completed`.

Every side effect goes through `RunPorts`, so the run is unit-tested with fakes and the NATS
wiring (`ports.py`) stays thin. Context assembly (`context.py`), the passes (`steps.py`),
checkpoints (`checkpoints.py`) and tool fan-out (`fanout.py`) live in their own modules.
"""

import asyncio
import contextlib
from datetime import UTC, datetime

import msgspec
import structlog
from opentelemetry import trace

from runbus.headers import RunContext
from runbus.messages import ChatMessage, RunCompleted, RunRequest, TextContent

from .agents import AgentSpec
from .checkpoints import Checkpointer, message_id
from .context import Start, assemble, stamp_input
from .events import RunEvents
from .harness.guardrails import Refusal
from .harness.runtime import Harness
from .recall import memorable_statements
from .run_ports import RunObserver, RunPorts
from .steps import run_passes, run_program_agent
from .turn import Turn

__all__ = ["RunObserver", "RunPorts", "execute_run"]

log = structlog.get_logger()


async def execute_run(
    request: RunRequest,
    agent: AgentSpec,
    ctx: RunContext,
    ports: RunPorts,
    harness: Harness | None = None,
    observer: RunObserver | None = None,
) -> RunCompleted:
    """One run: load context, loop model ↔ tools, checkpoint every step, apply memory policy.

    A redelivered run (same run_id) finds its own checkpointed messages in history and
    continues after them: no model call or tool call that already has a result is repeated.
    The agent's harness (guardrails, todo list, modes, loop mode, program agents) hooks in
    where noted; without one the run is the plain tool loop.
    """
    harness = harness or Harness.from_config(agent.harness)
    events = RunEvents(ports, ctx)
    inputs = stamp_input(request, datetime.now(UTC))
    await events.started(agent.name)
    if refusal := harness.refuse(inputs):
        return await _refuse(events, harness, refusal)
    checkpoint = Checkpointer(ports, ctx)
    start: Start | None = None
    try:
        start = await assemble(ctx, agent, ports, harness, inputs)
        checkpoint.history_end = start.history_end
        checkpoint.incarnation = start.incarnation
        if start.notice:
            await harness.acknowledge_mode(start.state)
        if not start.resumed_inputs:
            checkpoint.add(inputs)
        turn = Turn(
            agent,
            ctx,
            ports,
            harness,
            start.state,
            start.tools,
            start.prompt,
            start.progress,
            checkpoint,
            events,
            observer,
        )
        if harness.program is not None:
            usage = await run_program_agent(turn, start.inputs, start.earlier, start.recalled)
        else:
            usage = await run_passes(turn)
    except BaseException:
        # Whatever stops the run — even memory or the tool catalogue failing after the session
        # was claimed — what it produced so far is saved and the session released before the
        # failure is reported: the next run on the session finds it free and a valid prefix.
        with contextlib.suppress(Exception):
            await checkpoint.close(history_length=len(start.prompt) if start else None)
        raise

    statements = memorable_statements(inputs) if agent.memory.store_user_statements else []
    progress = start.progress
    history_length = len(start.earlier) + len(start.inputs) + len(progress.response)
    # Both finish before a failure of either is reported: the release is never left behind.
    for outcome in await asyncio.gather(
        checkpoint.close(history_length=history_length),
        *([ports.store_memory(ctx, statements)] if statements else []),
        return_exceptions=True,
    ):
        if isinstance(outcome, BaseException):
            raise outcome
    response = [msgspec.structs.replace(m, source="external") for m in progress.response]
    text = progress.final_text if progress.final_text is not None else response[-1].text
    return RunCompleted(run_id=ctx.run_id, response=response, text=text, usage=usage)


async def _refuse(events: RunEvents, harness: Harness, refusal: Refusal) -> RunCompleted:
    """A guardrail ended the run before any hop: no model call, nothing stored (the refused
    input may be the very secret the guardrail caught)."""
    run_id = events.run_id
    message, _ = harness.rewrite(
        ChatMessage(
            role="assistant",
            contents=[TextContent(text=refusal.text)],
            message_id=message_id(run_id, "m0"),
            created_at=datetime.now(UTC),
        )
    )
    trace.get_current_span().set_attribute("runbus.guardrail", refusal.guardrail)
    log.info("run_refused", run_id=run_id, guardrail=refusal.guardrail)
    await events.text(message.message_id, message.text, event_id="refusal")
    return RunCompleted(run_id=run_id, response=[message], text=message.text)
