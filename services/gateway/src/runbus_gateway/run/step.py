"""Steps: the model called on the prompt (compacted, with the instructions and each step's
context), its tool calls run, until it answers; in loop mode more passes while the harness's
evaluators ask. A program agent answers instead of the model, under the same contract."""

from datetime import UTC, datetime

import msgspec
from opentelemetry import trace

from runbus.messages import ChatMessage, Usage

from ..errors import MaxIterationsExceeded, ToolErrorLimit, TooManyToolCalls
from ..harness.evaluators import Continue, feedback_message
from ..harness.programs import ProgramRun, run_program
from ..harness.runtime import with_context
from .compaction import compact_prompt
from .context import before_step, instructions
from .output import checked, guard, repair_message
from .pause import Held
from .start import Run
from .state import RunState, message_id
from .tools import result_text, run_tools


async def run_steps(run: Run, state: RunState) -> Usage:
    """The model's steps, or the program's answer; the tokens used."""
    if run.harness.program is not None:
        return await _program(run, state)
    usage = Usage()
    iteration = 1 + sum(1 for m in state.response if ":loop" in m.message_id)
    while True:
        usage += await _steps(run, state)
        if state.final_text is not None or not run.harness.config.loop.enabled:
            return usage
        await run.session.refresh()
        decision = run.harness.next_pass(
            run.session.bag, iteration=iteration, answer=state.response[-1].text
        )
        if not isinstance(decision, Continue):
            trace.get_current_span().set_attribute("runbus.loop.stop", decision.reason)
            return usage
        state.record(feedback_message(decision, message_id(state.run_id, f"loop{iteration}")))
        state.finished = False
        iteration += 1


async def _steps(run: Run, state: RunState) -> Usage:
    """Model ↔ tools until the model answers without calls; returns the tokens used."""
    agent = run.agent
    usage = Usage()
    failed_steps = 0
    calls, state.pending_calls = state.pending_calls, []
    # Calls a resumed run found checkpointed may have been sent before it was resumed.
    first_send = False
    repaired = False
    # Messages the owner added at a pause: the model reads them after the pending calls'
    # results.
    notes: list[ChatMessage] = []
    while not state.finished:
        if not calls:
            if state.step >= agent.max_iterations:
                raise MaxIterationsExceeded(agent.max_iterations)
            held = await _pause(run, state, None)
            if held is not None:
                if held.reply is not None:
                    # Paused on before the run was redelivered: go on with it, as edited.
                    calls, notes = held.reply.function_calls, held.added
                    first_send = True
                    state.record(held.reply)
                    continue
                _note(state, held.added)
            reply_id = message_id(state.run_id, f"m{state.step}")
            extra = _step_context(run, state)
            view = await compact_prompt(
                run.ports, run.events, agent.compaction, state.prompt, state.step, state.checkpoints
            )
            view = with_context(view, extra)
            reply = await run.ports.complete(
                run.ctx,
                agent.model,
                view,
                run.tools,
                reply_id,
                agent.model_settings,
                output=agent.output_format,
                stream=not agent.holds_text,
            )
            usage += reply.usage + Usage(cost=reply.cost)
            message = msgspec.structs.replace(reply.message, message_id=reply_id, source="external")
            calls = message.function_calls
            first_send = True
            if len(calls) > agent.max_tool_calls:
                # Refused before any runs or is stored: a reply of thousands of calls would
                # run them all and then not fit in a message.
                raise TooManyToolCalls(len(calls), agent.max_tool_calls)
            if not calls:
                _, invalid = checked(message.text, agent.output_format, repaired=repaired)
                if invalid is not None:
                    # The one repair turn: the refused answer and why, in the prompt only —
                    # never shown (the text was held) nor stored.
                    state.prompt += [message, repair_message(invalid, f"{reply_id}:output-repair")]
                    state.step += 1
                    repaired = True
                    continue
            message = await _show(run, message, final=not calls)
            if calls:
                held = await _pause(run, state, message)
                if held is not None:
                    notes = held.added
                    if held.reply is None:  # every call dropped: the model answers again
                        _note(state, notes)
                        notes, calls = [], []
                        continue
                    message, calls = held.reply, held.reply.function_calls
            state.record(message)
            if not calls:
                state.finish()
                break
        # The calls are saved before any runs: a run resumed after a lost checkpoint would
        # ask the model again, get new call ids (the executor's idempotency keys) and repeat
        # side effects. The step's first call event carries the checkpoint, and the step
        # waits until it is stored: exactly-once tools for no stored write of their own. An
        # event the stream refused as a duplicate (a call id an earlier step used) carries
        # nothing of this step: then history gets the checkpoint before the calls run.
        client = await run.toolsets.hand_over(calls)
        if not await run.events.tool_calls(calls, client, await state.checkpoints.checkpoint()):
            await state.checkpoints.flush()
        if run.pause is not None:
            # Read once the calls are stored: a later delivery that started before this read
            # is stopped here; one that starts after it resumes from these very calls.
            await run.pause.current(state.run_id)
        results, terminated = await run_tools(run.toolsets, calls, first_send=first_send)
        await run.events.tool_results(results)
        tool_message = ChatMessage(
            role="tool",
            contents=list(results),
            message_id=message_id(state.run_id, f"t{state.step - 1}"),
            created_at=datetime.now(UTC),
        )
        state.record(tool_message, urgent=run.toolsets.urgent(calls))
        _note(state, notes)
        calls, notes = [], []
        if terminated is not None:
            state.finish(result_text(terminated))
            break
        failed_steps = failed_steps + 1 if all(r.error is not None for r in results) else 0
        if failed_steps >= agent.max_consecutive_tool_errors:
            raise ToolErrorLimit(agent.max_consecutive_tool_errors)
    return usage


async def _pause(run: Run, state: RunState, reply: ChatMessage | None) -> Held | None:
    """A step boundary: where the owner's pause stops the run (`pause.py`)."""
    if run.pause is None:
        return None
    recorded = {m.message_id for m in state.response}
    return await run.pause.at(
        run.events, state.step, reply, run.tools, state.checkpoints.flush, recorded
    )


def _note(state: RunState, added: list[ChatMessage]) -> None:
    for message in added:
        state.record(msgspec.structs.replace(message, created_at=datetime.now(UTC)))


async def _show(run: Run, message: ChatMessage, *, final: bool) -> ChatMessage:
    """The model's reply as the user reads it: the final answer rewritten (not one with an
    output format: it stays the JSON that was checked); with held text, every reply's text
    checked by the output guardrails, then shown as one delta. `OutputBlocked` leaves no
    trace of the text: it was never streamed, and the reply is never recorded."""
    agent = run.agent
    appended: str | None = ""
    if final and agent.output_format is None:
        message, appended = run.harness.rewrite(message)
    if not agent.holds_text:
        if appended:
            event_id = f"rewrite-{message.message_id}"
            await run.events.text(message.message_id, appended, event_id=event_id)
        return message
    guard(agent.output_guardrails, message)
    if message.text:
        event_id = f"held-{message.message_id}"
        await run.events.text(message.message_id, message.text, event_id=event_id)
    return message


def _step_context(run: Run, state: RunState) -> list[ChatMessage]:
    """What the providers add to the next model call: the system message is written again in
    place (it changes when `mode_set` does), the step's messages are returned."""
    contexts = before_step(run.providers, run.session.bag)
    state.prompt[0] = instructions(run.agent, contexts)
    return [m for c in contexts for m in c.messages]


async def _program(run: Run, state: RunState) -> Usage:
    """A non-LLM agent answers instead of the model loop, under the same run contract."""
    if state.finished:
        return Usage()
    assert run.harness.program is not None
    ctx = run.ctx
    program_run = ProgramRun(
        run_id=ctx.run_id,
        session_id=ctx.session_id,
        agent=run.agent.name,
        user_id=ctx.prop("user_id"),
        tenant=ctx.prop("tenant"),
        inputs=state.inputs,
        history=state.earlier,
        state=run.session.bag,
        context=state.context.recalled,
    )
    replies = await run_program(
        run.harness.program, run.agent.harness.program or "", program_run, run.session
    )
    for index, reply in enumerate(replies):
        reply = msgspec.structs.replace(
            reply, message_id=message_id(ctx.run_id, f"m{index}"), created_at=datetime.now(UTC)
        )
        if index == len(replies) - 1:
            if run.agent.output_format is None:
                reply, _ = run.harness.rewrite(reply)
            else:
                checked(reply.text, run.agent.output_format, repaired=True)
        guard(run.agent.output_guardrails, reply)
        await run.events.text(reply.message_id, reply.text, event_id=f"program-{index}")
        state.record(reply)
    state.finish()
    return Usage()
