"""The run from request to `run.completed`, stage by stage: admit, start, steps, settle.

Every side effect goes through `RunPorts`, so the run is unit-tested with fakes and the NATS
wiring (`runbus_gateway.ports`) stays thin.
"""

from datetime import UTC, datetime

from runbus.headers import RunContext
from runbus.messages import RunCompleted, RunRequest

from ..agents import AgentSpec
from .admit import refuse, stamp_input
from .checkpoints import Checkpointer
from .events import RunEvents
from .pause import PausePoint, Superseded
from .ports import RunPorts
from .settle import release, settle
from .start import start
from .state import RunState
from .step import run_steps
from .toolsets import OnWaiting


async def execute_run(
    request: RunRequest,
    agent: AgentSpec,
    ctx: RunContext,
    ports: RunPorts,
    on_waiting: OnWaiting | None = None,
    pause: PausePoint | None = None,
) -> RunCompleted:
    """One run: admit the input, start from the session (or resume where a redelivered run
    stood), step model ↔ tools with a checkpoint per step, settle.

    A redelivered run (same run_id) finds its own checkpointed messages in history and
    continues after them: no model call or tool call that already has a result is repeated.
    `on_waiting` is told when a call starts and stops waiting for a person's approval;
    `pause` stops the run at a step boundary when its owner asks.
    """
    agent = agent.for_run(request.output_format)
    events = RunEvents(ports, ctx)
    inputs = stamp_input(request, datetime.now(UTC))
    await events.started(agent.name)
    if refusal := agent.runtime.refuse(inputs):
        return await refuse(events, agent.runtime, refusal)
    checkpoints = Checkpointer(ports, ctx)
    state: RunState | None = None
    try:
        run, state = await start(
            agent, ctx, ports, events, inputs, checkpoints, on_waiting, request.client_tools, pause
        )
        # What its child runs (agents called as tools) used is the run's too.
        usage = await run_steps(run, state) + run.toolsets.child_usage()
    except Superseded:
        raise  # the run goes on in a later delivery, which holds the session now
    except BaseException:
        await release(checkpoints, state, pause, ctx.run_id)
        raise
    return await settle(run, state, usage)
