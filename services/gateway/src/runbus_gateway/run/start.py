"""Start: the session opened and claimed, while the context providers and the toolsets get
ready; then the run's state — a new run's, or where a redelivered one stood."""

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages import ChatMessage, ToolSpec
from runbus.messages.memory import MEMORY_SEARCH_TOOL
from runbus.messages.sessions import SessionOpened

from ..agents import AgentSpec
from ..errors import GatewayConfigError
from ..harness.runtime import Harness
from ..harness.state import SessionState
from .a2a_tools import RemoteAgents
from .agent_tools import AgentTools, ChildPorts
from .checkpoints import Checkpointer
from .context import (
    ContextProvider,
    HarnessContext,
    MemoryContext,
    RunStart,
    before_step,
    instructions,
)
from .events import RunEvents
from .handoffs import PREFIX as HANDOFF_PREFIX
from .handoffs import HandoffTools
from .pause import PausePoint
from .ports import RunPorts
from .state import Context, RunState
from .tools import Toolsets
from .toolsets import (
    Approving,
    CatalogTools,
    ClientTools,
    HarnessTools,
    MemorySearchTool,
    OnWaiting,
    Toolset,
    check_client_tools,
)


@dataclass
class Run:
    """What one run works with, built once by `start`: its agent and context, the hops it
    makes, its events, and what it draws on (toolsets, context providers)."""

    agent: AgentSpec
    harness: Harness
    ctx: RunContext
    ports: RunPorts
    events: RunEvents
    session: SessionState
    toolsets: Toolsets
    tools: list[ToolSpec]
    """What the toolsets offer the model in this run."""
    providers: list[ContextProvider]
    pause: PausePoint | None = None
    """Where its owner's pause stops it (`pause.py`); None: it does not pause."""


async def start(
    agent: AgentSpec,
    ctx: RunContext,
    ports: RunPorts,
    events: RunEvents,
    inputs: list[ChatMessage],
    checkpoints: Checkpointer,
    on_waiting: OnWaiting | None,
    client_tools: Sequence[ToolSpec] = (),
    pause: PausePoint | None = None,
) -> tuple[Run, RunState]:
    """Open the session while the providers give the run's starting context and the toolsets
    their tools, then load the state: the prompt is the instructions, recalled memory, the
    history, notices, the input, and whatever this run already produced."""
    harness = agent.runtime
    own = [
        *agent.tools,
        MEMORY_SEARCH_TOOL.name,
        *(t.name for t in harness.tools),
        *(t.tool_name for t in agent.agent_tools),
        *(a.name for a in agent.remote_agents),
        *(f"{HANDOFF_PREFIX}{name}" for name in agent.handoffs),
    ]
    check_client_tools(agent.name, agent.client_tools, own, client_tools)
    opening = asyncio.ensure_future(_open_session(ports, ctx, agent))
    session = asyncio.ensure_future(_state_of(ports, ctx, opening))
    waiting: set[str] = set()

    def approving(toolset: CatalogTools) -> Approving:
        return Approving(toolset, ports, events, waiting, on_waiting)

    toolsets = Toolsets(
        [
            approving(CatalogTools(ports, ctx, agent.tools)),
            *_agent_tools(agent, ctx, ports, waiting, on_waiting),
            *(
                [RemoteAgents(agent.remote_agents, ports, events, waiting, on_waiting)]
                if agent.remote_agents
                else []
            ),
            *([approving(MemorySearchTool(ports, ctx))] if agent.memory.offers_tool else []),
            HarnessTools(harness, session),
            *([HandoffTools(agent, ctx, session)] if agent.handoffs else []),
            *([ClientTools(client_tools, ports, ctx, waiting, on_waiting)] if client_tools else []),
        ],
        waiting,
    )
    providers: list[ContextProvider] = [
        MemoryContext(ports, ctx, agent.memory),
        HarnessContext(harness),
    ]
    begin = RunStart(inputs=inputs, session=session)
    opened, state_bag, contexts, tools, checkpointed = await asyncio.gather(
        opening,
        session,
        asyncio.gather(*(p.before_run(begin) for p in providers)),
        toolsets.tools(),
        ports.checkpointed(ctx),
    )
    run = Run(agent, harness, ctx, ports, events, state_bag, toolsets, tools, providers, pause)
    context = Context(
        recalled=[m for c in contexts for m in c.recalled],
        notices=[m for c in contexts for m in c.notices],
    )
    system = instructions(agent, before_step(providers, state_bag.bag))
    state = RunState.load(ctx.run_id, opened, inputs, context, system, checkpoints, checkpointed)
    return run, state


async def _open_session(ports: RunPorts, ctx: RunContext, agent: AgentSpec) -> SessionOpened:
    """Open and claim the session; with policy `enqueue`, wait while another run holds it."""
    delay = 0.02
    while True:
        try:
            return await ports.open_session(ctx, agent.concurrency)
        except RemoteError as exc:
            if exc.known_code != "session_busy" or agent.concurrency != "enqueue":
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


async def _state_of(
    ports: RunPorts, ctx: RunContext, opening: asyncio.Future[SessionOpened]
) -> SessionState:
    """The session's state bag, once it is open: one object for every reader and writer of
    the run, so their compare-and-set writes go one at a time."""
    return SessionState(ports, ctx, (await opening).record)


def _agent_tools(
    agent: AgentSpec,
    ctx: RunContext,
    ports: RunPorts,
    waiting: set[str],
    on_waiting: OnWaiting | None,
) -> list[Toolset]:
    """The toolsets of other agents the run may call: this gateway's (child runs)."""
    if not agent.agent_tools:
        return []
    if not isinstance(ports, ChildPorts):
        raise GatewayConfigError(f"agent {agent.name!r} calls agents; these ports cannot")
    return [AgentTools(agent.agent_tools, ports, ctx, waiting, on_waiting)]
