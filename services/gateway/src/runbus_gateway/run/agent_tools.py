"""Other agents as tools: a call starts a child run of that agent on the bus — the same owner,
the parent's tree in its request — and the parent waits for its final event. The child's id
comes from the parent's run id and the call id, so a resumed parent finds the child it
started (running, or ended) instead of starting another: its answer is the result once."""

import hashlib
from collections.abc import Sequence
from typing import Final, Protocol, runtime_checkable

from runbus.errors import RunbusError
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    RunCompleted,
    RunFailed,
    RunRequest,
    TextContent,
    ToolSpec,
    Usage,
)
from runbus.messages.tools import ToolInvoked

from ..agents import AgentTool
from .toolsets import OnWaiting

MAX_DEPTH: Final = 4
"""Parents a child run may have at most: a call that would go deeper is refused."""
MAX_FAN_OUT: Final = 8
"""Child runs one run may wait on at once."""

INPUT_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "description": "What to ask the agent, in full."},
    },
    "required": ["input"],
}


class AgentCallDepth(RunbusError):
    code = "agent_call_depth"

    def __init__(self, agent: str, depth: int) -> None:
        super().__init__(
            f"agent {agent!r} was not called: the run is already {depth} agent calls deep "
            f"(at most {MAX_DEPTH}); answer with what you have",
            details={"depth": depth, "limit": MAX_DEPTH},
        )
        self.agent = agent
        self.depth = depth


class AgentCallFanOut(RunbusError):
    code = "agent_call_fan_out"

    def __init__(self, agent: str) -> None:
        super().__init__(
            f"agent {agent!r} was not called: this run already waits on {MAX_FAN_OUT} agents; "
            "call it again once some have answered",
            details={"limit": MAX_FAN_OUT},
        )
        self.agent = agent


@runtime_checkable
class ChildPorts(Protocol):
    """The hops of a child run (the bus adapters implement them)."""

    async def call_agent(
        self, ctx: RunContext, request: RunRequest, tool: str, *, first_send: bool
    ) -> RunCompleted | RunFailed:
        """Start the child run `request` as the parent's owner, unless it was started before
        (never, when `first_send`: the call was never sent), and wait for its final event; a
        cancel of the parent cancels it."""
        ...


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The child run of one call: the same for every delivery of the parent, and an id
    (`Identifier`) whatever the call id holds."""
    tail = hashlib.sha256(f"{parent_run_id}\0{call_id}".encode()).hexdigest()[:20]
    return f"{parent_run_id[:96]}-{tail}"


class AgentTools:
    """The agents a run may call (`[[agent_tools]]`), each as a tool taking one `input`."""

    urgent = False  # the child's answer is kept by its run id, not lost with the call

    def __init__(
        self,
        tools: Sequence[AgentTool],
        ports: ChildPorts,
        ctx: RunContext,
        waiting: set[str],
        on_waiting: OnWaiting | None,
    ) -> None:
        self.by_name = {t.tool_name: t for t in tools}
        self.ports = ports
        self.ctx = ctx
        self.waiting = waiting
        self.on_waiting = on_waiting
        self.in_flight = 0
        self.usage = Usage()
        """Tokens of the child runs this run waited on (rolled up into its own)."""

    async def tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name=name,
                description=tool.description or f"Ask the {tool.agent!r} agent.",
                parameters=INPUT_SCHEMA,
            )
            for name, tool in self.by_name.items()
        ]

    def handles(self, name: str) -> bool:
        return name in self.by_name

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        tool = self.by_name[call.name]
        text = call.arguments.get("input")
        if not isinstance(text, str) or not text.strip():
            error = "invalid_arguments: `input` must be the text to ask the agent"
            return _error(call, error)
        if self.in_flight >= MAX_FAN_OUT:
            return _refused(call, AgentCallFanOut(tool.agent))
        depth = int(self.ctx.prop("depth") or 0)
        if depth + 1 > MAX_DEPTH:
            return _refused(call, AgentCallDepth(tool.agent, depth))
        request = self.child_request(tool, call, text, depth + 1)
        self.in_flight += 1
        # Its slot is lent out meanwhile, as for a person's approval: a replica full of
        # parents must still run their children.
        self.waiting.add(call.call_id)
        await self._tell(True)
        try:
            ended = await self.ports.call_agent(self.ctx, request, call.name, first_send=first_send)
        finally:
            await self._tell(False)
            self.waiting.discard(call.call_id)
            self.in_flight -= 1
        if isinstance(ended, RunFailed):
            return _error(call, f"{ended.error.code}: {ended.error.message}")
        self.usage += ended.usage
        value = ended.output if ended.output is not None else ended.text
        return ToolInvoked(result=FunctionResultContent(call_id=call.call_id, result=value))

    def child_request(
        self, tool: AgentTool, call: FunctionCallContent, text: str, depth: int
    ) -> RunRequest:
        run_id = child_run_id(self.ctx.run_id, call.call_id)
        return RunRequest(
            run_id=run_id,
            agent=tool.agent,
            # A conversation of its own: the child sees the question, not the parent's talk.
            session_id=run_id,
            input=[ChatMessage(role="user", contents=[TextContent(text=text)])],
            parent_run_id=self.ctx.run_id,
            root_run_id=self.ctx.prop("root_run_id") or self.ctx.run_id,
            depth=depth,
        )

    async def _tell(self, waiting: bool) -> None:
        if self.on_waiting is not None:
            await self.on_waiting(waiting, person=False)  # for its child: still `running`


def _error(call: FunctionCallContent, error: str) -> ToolInvoked:
    return ToolInvoked(result=FunctionResultContent(call_id=call.call_id, error=error))


def _refused(call: FunctionCallContent, exc: RunbusError) -> ToolInvoked:
    """A limit's typed error, as the model reads it (code first)."""
    return _error(call, f"{exc.code}: {exc.message}")
