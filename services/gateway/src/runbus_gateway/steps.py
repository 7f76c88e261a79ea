"""The run's passes: model ↔ tools until an answer, loop-mode passes, program agents, and the
compaction of the prompt copy before each model call."""

from datetime import UTC, datetime

import msgspec
from opentelemetry import trace

from runbus.messages import ChatMessage, TextContent, Usage

from .agents import AgentSpec
from .checkpoints import Checkpointer, message_id, persisted_compaction
from .compaction_gate import may_compact
from .errors import MaxIterationsExceeded, ToolErrorLimit, TooManyToolCalls
from .events import RunEvents
from .fanout import result_text, run_tools
from .harness.evaluators import Continue, feedback_message
from .harness.programs import ProgramRun, run_program
from .harness.runtime import with_context
from .run_ports import RunPorts
from .turn import Turn


async def run_passes(turn: Turn) -> Usage:
    """The tool loop, then (loop mode) more passes while the harness's evaluators ask."""
    usage = Usage()
    iteration = 1 + sum(1 for m in turn.progress.response if ":loop" in m.message_id)
    while True:
        usage += await _loop(turn)
        if turn.progress.final_text is not None or not turn.harness.config.loop.enabled:
            return usage
        await turn.state.refresh()
        decision = turn.harness.next_pass(
            turn.state.bag, iteration=iteration, answer=turn.progress.response[-1].text
        )
        if not isinstance(decision, Continue):
            trace.get_current_span().set_attribute("runbus.loop.stop", decision.reason)
            return usage
        feedback = feedback_message(decision, message_id(turn.ctx.run_id, f"loop{iteration}"))
        turn.prompt.append(feedback)
        turn.progress.response.append(feedback)
        turn.checkpoint.add([feedback])
        turn.progress.finished = False
        iteration += 1


async def run_program_agent(
    turn: Turn,
    inputs: list[ChatMessage],
    history: list[ChatMessage],
    recalled: ChatMessage | None,
) -> Usage:
    """A non-LLM agent answers instead of the model loop, under the same run contract."""
    if turn.progress.finished:
        return Usage()
    assert turn.harness.program is not None
    ctx = turn.ctx
    run = ProgramRun(
        run_id=ctx.run_id,
        session_id=ctx.session_id,
        agent=turn.agent.name,
        user_id=ctx.prop("user_id"),
        tenant=ctx.prop("tenant"),
        inputs=inputs,
        history=history,
        state=turn.state.bag,
        context=[recalled] if recalled else [],
    )
    replies = await run_program(
        turn.harness.program, turn.agent.harness.program or "", run, turn.state
    )
    for index, reply in enumerate(replies):
        reply = msgspec.structs.replace(
            reply, message_id=message_id(ctx.run_id, f"m{index}"), created_at=datetime.now(UTC)
        )
        if index == len(replies) - 1:
            reply, _ = turn.harness.rewrite(reply)
        await turn.events.text(reply.message_id, reply.text, event_id=f"program-{index}")
        turn.prompt.append(reply)
        turn.progress.response.append(reply)
        turn.checkpoint.add([reply])
    turn.progress.finished = True
    return Usage()


async def compact_prompt(
    ports: RunPorts,
    events: RunEvents,
    agent: AgentSpec,
    prompt: list[ChatMessage],
    step: int,
    checkpoint: Checkpointer | None = None,
) -> list[ChatMessage]:
    """The prompt copy the model sees; with `persist`, what it made of the history is also
    stored, and the run goes on from it. The hop is skipped while no trigger of the agent's
    policy can hold (or it has none): the prompt is already a valid provider list (history
    repairs what it loads)."""
    if not may_compact(agent.compaction, prompt):
        return prompt
    ctx = events.ctx
    compacted = await ports.compact(ctx, prompt, agent.compaction)
    persisted = persisted_compaction(compacted, ctx.run_id) if agent.compaction.persist else None
    stored = persisted is not None and checkpoint is not None and checkpoint.persist(persisted)
    first = compacted.messages[0].message_id if compacted.messages else None
    if stored and first == prompt[0].message_id:
        # History holds the session compacted now: the run's later steps go on from that,
        # as the next run will, instead of compacting the same history again at each step
        # (a hop and a `run.compacted` event per step of every run of a long session). The
        # instructions stay first (`_instruct` rewrites them in place).
        prompt[:] = compacted.messages
    if compacted.compacted or any(s.error for s in compacted.report.steps):
        await events.compacted(step, compacted.report)
    return compacted.messages


async def _loop(turn: Turn) -> Usage:
    """Model ↔ tools until the model answers without calls; returns the tokens used."""
    agent, ctx, ports, progress = turn.agent, turn.ctx, turn.ports, turn.progress
    usage = Usage()
    failed_steps = 0
    calls = progress.pending_calls
    # Calls a resumed run found checkpointed may have been sent before it was resumed.
    first_send = False
    while not progress.finished:
        if not calls:
            if progress.step >= agent.max_iterations:
                raise MaxIterationsExceeded(agent.max_iterations)
            reply_id = message_id(ctx.run_id, f"m{progress.step}")
            _instruct(turn)
            view = await compact_prompt(
                ports, turn.events, agent, turn.prompt, progress.step, turn.checkpoint
            )
            todo = turn.harness.todo_message(turn.state.bag)
            view = with_context(view, [todo] if todo else [])
            reply = await ports.complete(
                ctx, agent.model, view, turn.tools, reply_id, agent.model_settings
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
                message, appended = turn.harness.rewrite(message)
                if appended:
                    await turn.events.text(reply_id, appended, event_id=f"rewrite-{reply_id}")
            turn.prompt.append(message)
            progress.response.append(message)
            progress.step += 1
            turn.checkpoint.add([message])
            if not calls:
                progress.finished = True
                break
        # The calls are saved before any runs: a run resumed after a lost checkpoint would
        # ask the model again, get new call ids (the executor's idempotency keys) and repeat
        # side effects. One history round trip per tool step buys exactly-once tools.
        await turn.checkpoint.flush()
        await turn.events.tool_calls(calls)
        results, terminated = await run_tools(turn, calls, first_send=first_send)
        await turn.events.tool_results(results)
        tool_message = ChatMessage(
            role="tool",
            contents=list(results),
            message_id=message_id(ctx.run_id, f"t{progress.step - 1}"),
            created_at=datetime.now(UTC),
        )
        turn.prompt.append(tool_message)
        progress.response.append(tool_message)
        turn.checkpoint.add([tool_message], urgent=any(turn.harness.handles(c.name) for c in calls))
        calls = []
        if terminated is not None:
            progress.finished = True
            progress.final_text = result_text(terminated)
            break
        failed_steps = failed_steps + 1 if all(r.error is not None for r in results) else 0
        if failed_steps >= agent.max_consecutive_tool_errors:
            raise ToolErrorLimit(agent.max_consecutive_tool_errors)
    return usage


def _instruct(turn: Turn) -> None:
    """The system message with the agent's instructions and what the harness adds now (the
    todo guidance, the current mode's rules): rebuilt per call, as `mode_set` changes it."""
    extra = turn.harness.instructions(turn.state.bag)
    text = turn.agent.instructions.strip() + (f"\n\n{extra}" if extra else "")
    turn.prompt[0] = msgspec.structs.replace(turn.prompt[0], contents=[TextContent(text=text)])
