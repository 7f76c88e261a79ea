"""Toolsets: where the tools a run may call come from, each behind one shape — the specs it
offers, whether it handles a name, and a call. The tool executor's catalogue and the
`memory_search` tool are called over the bus, behind the approval wrapper; the harness's todo
and mode tools run here; the client's own tools go to the client, and the run waits for its
answer. A new tool source is a new `Toolset`, registered in `start`."""

import asyncio
import re
import time
from collections.abc import Collection, Sequence
from typing import Final, Protocol

import msgspec

from runbus.errors import BadRequest
from runbus.headers import RunContext
from runbus.messages import FunctionCallContent, ToolSpec
from runbus.messages.memory import MEMORY_SEARCH_TOOL
from runbus.messages.tools import ApprovalGrant, ToolInvoked

from ..harness.runtime import Harness
from ..harness.state import SessionState
from .events import RunEvents
from .late import hand_back_if_late
from .ports import RunPorts

TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A tool name that is safe in a subject (`runbus.tools.<name>`)."""

MAX_TOOLS: Final = 32
"""Client tools one run may bring."""
MAX_SPEC_BYTES: Final = 16 * 1024
"""Size of one client tool's encoded spec (its JSON Schema mostly) at most."""


class OnWaiting(Protocol):
    """Told when a call of the run starts (True) or stops (False) waiting: for a person (the
    run shows `waiting_approval`), or with `person=False` for other work, such as a child run
    (it stays `running`). Either way the run holds no slot or tenant lease meanwhile."""

    async def __call__(self, waiting: bool, *, person: bool = True) -> None: ...


class Toolset(Protocol):
    urgent: bool
    """Its results are stored at once: its calls' effects are not recorded by call id."""

    async def tools(self) -> list[ToolSpec]:
        """The tools it offers the model in this run."""
        ...

    def handles(self, name: str) -> bool:
        """Whether a call by that name is its to run."""
        ...

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        """Run one call; `first_send`: this run never sent it before."""
        ...


class BusToolset(Toolset, Protocol):
    """A toolset whose calls a person may have to approve first (`Approving`)."""

    async def call(
        self, call: FunctionCallContent, *, first_send: bool, approval: ApprovalGrant | None = None
    ) -> ToolInvoked: ...


class CatalogTools:
    """The agent's tools the tool executor serves, listed from its (cached) catalogue."""

    urgent = False

    def __init__(self, ports: RunPorts, ctx: RunContext, names: Sequence[str]) -> None:
        self.ports = ports
        self.ctx = ctx
        self.names = list(names)

    async def tools(self) -> list[ToolSpec]:
        return await self.ports.list_tools(self.ctx, self.names)

    def handles(self, name: str) -> bool:
        return TOOL_NAME.fullmatch(name) is not None and name in self.names

    async def call(
        self, call: FunctionCallContent, *, first_send: bool, approval: ApprovalGrant | None = None
    ) -> ToolInvoked:
        return await self.ports.invoke_tool(
            self.ctx, call, approval=approval, first_send=first_send
        )


class MemorySearchTool(CatalogTools):
    """`memory_search` (memory retrieval `on_demand`), served by the memory service; its scope
    is fixed by the run's trusted properties, never by the model."""

    def __init__(self, ports: RunPorts, ctx: RunContext) -> None:
        super().__init__(ports, ctx, [MEMORY_SEARCH_TOOL.name])

    async def tools(self) -> list[ToolSpec]:
        return [MEMORY_SEARCH_TOOL]


class Approving:
    """Wraps a bus toolset: a call its tool says needs a person's approval is announced, waits
    for the decision (the run's slot lent out meanwhile, through `on_waiting`) and is sent
    again with it."""

    def __init__(
        self,
        inner: BusToolset,
        ports: RunPorts,
        events: RunEvents,
        waiting: set[str],
        on_waiting: OnWaiting | None,
    ) -> None:
        self.inner = inner
        self.urgent = inner.urgent
        self.ports = ports
        self.events = events
        self.waiting = waiting
        """Ids of the run's calls waiting for a person (shared by the run's toolsets)."""
        self.on_waiting = on_waiting

    async def tools(self) -> list[ToolSpec]:
        return await self.inner.tools()

    def handles(self, name: str) -> bool:
        return self.inner.handles(name)

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        invoked = await self.inner.call(call, first_send=first_send)
        if invoked.outcome != "approval_required" or invoked.approval is None:
            return invoked
        request = invoked.approval

        async def announce() -> None:
            await self.events.approval_requested(call.call_id, request)

        self.waiting.add(call.call_id)
        await self._tell(True)
        asked_at = time.time()
        try:
            grant = await self.ports.await_approval(self.events.ctx, call, request, announce)
        finally:
            await self._tell(False)
            self.waiting.discard(call.call_id)
        if grant.decided_at >= asked_at:
            # Decided during this wait (a later delivery finds it decided and goes on): the
            # call has not run, so a delivery with time left makes it, once.
            hand_back_if_late(self.events.ctx, "an approval")
        # Asked for approval, the call was not run nor claimed: still a first send.
        return await self.inner.call(call, first_send=first_send, approval=grant)

    async def _tell(self, waiting: bool) -> None:
        if self.on_waiting is not None:
            await self.on_waiting(waiting)


class HarnessTools:
    """The harness's todo and mode tools, run here against the session's state bag."""

    urgent = True

    def __init__(self, harness: Harness, session: asyncio.Future[SessionState]) -> None:
        self.harness = harness
        self.session = session

    async def tools(self) -> list[ToolSpec]:
        return self.harness.tools

    def handles(self, name: str) -> bool:
        return self.harness.handles(name)

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        state = await self.session
        return ToolInvoked(result=await self.harness.call_tool(state, call), untrusted=False)


class ClientTools:
    """The caller's own tools (`RunRequest.client_tools`): a call goes to the caller — it reads
    it in the run's events — and the run waits, its slot lent out, until the caller answers
    (`client_tools.answer`). The wait is durable: the call was checkpointed before it was
    made, and its record keeps the answer for a redelivered run."""

    urgent = False

    def __init__(
        self,
        specs: Sequence[ToolSpec],
        ports: RunPorts,
        ctx: RunContext,
        waiting: set[str],
        on_waiting: OnWaiting | None,
    ) -> None:
        self.specs = list(specs)
        self.names = {spec.name for spec in specs}
        self.ports = ports
        self.ctx = ctx
        self.waiting = waiting
        self.on_waiting = on_waiting

    async def tools(self) -> list[ToolSpec]:
        return self.specs

    def handles(self, name: str) -> bool:
        return name in self.names

    async def hand_over(self, call: FunctionCallContent) -> None:
        """Record the call as pending before the client can read it (its answer then always
        finds it)."""
        await self.ports.hand_to_client(self.ctx, call)

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        self.waiting.add(call.call_id)
        if self.on_waiting is not None:
            await self.on_waiting(True)
        had = self.ctx.time_left()
        try:
            result = await self.ports.await_client(self.ctx, call)
        finally:
            if self.on_waiting is not None:
                await self.on_waiting(False)
            self.waiting.discard(call.call_id)
        # Answered so late that the run could not finish its next steps in this delivery:
        # the answer is stored with the call, and a delivery with a deadline of its own reads
        # it at once (and, having had time, does not hand back again).
        hand_back_if_late(self.ctx, "its client", had=had)
        # The client's output is data from outside, like any tool's (`untrusted`).
        return ToolInvoked(result=result)


class ClientToolsRefused(BadRequest):
    """The run brings client tools and its agent does not take any (`client_tools = false`)."""

    def __init__(self, agent: str, names: list[str]) -> None:
        shown = ", ".join(repr(n[:64]) for n in names[:5]) + (", …" if len(names) > 5 else "")
        super().__init__(
            f"agent {agent!r} does not accept the client's own tools ({shown}); it runs only "
            "its own tools: send the request without them",
            details={"param": "tools"},
        )
        self.agent = agent
        self.names = names


def check_client_tools(
    agent: str, allowed: bool, own: Collection[str], specs: Sequence[ToolSpec]
) -> None:
    """Refuse client tools the agent does not take, too many, an unsafe or duplicate name, a
    name of the agent's own tools, or a spec too large."""
    if not specs:
        return
    names = [spec.name for spec in specs]
    if not allowed:
        raise ClientToolsRefused(agent, names)
    if len(specs) > MAX_TOOLS:
        raise BadRequest(f"at most {MAX_TOOLS} client tools per run, not {len(specs)}")
    for spec in specs:
        if TOOL_NAME.fullmatch(spec.name) is None:
            raise BadRequest(f"client tool name {spec.name[:80]!r} is not [A-Za-z0-9_-]{{1,64}}")
        if len(msgspec.json.encode(spec)) > MAX_SPEC_BYTES:
            raise BadRequest(f"client tool {spec.name!r} is larger than {MAX_SPEC_BYTES} bytes")
    if len(set(names)) != len(names):
        raise BadRequest("client tool names must be distinct")
    if clash := sorted(set(names) & set(own)):
        raise BadRequest(f"client tools {clash!r} have the names of the agent's own tools")
