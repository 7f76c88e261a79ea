"""Handoffs: an agent with `handoffs` may hand the conversation to one of them with a
`transfer_to_<agent>` tool. The call ends the run (its result is the answer) and the session's
state bag records who holds the session now, so the session's next runs go to that agent —
for good, or, when the holder's `handoff_holds` is `"run"`, for one run and then back to the
agent the client addresses. The call and its result stay in the session's history."""

import asyncio
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages import FunctionCallContent, FunctionResultContent, ToolSpec
from runbus.messages.tools import ToolInvoked

from ..agents import AgentSpec
from ..harness.state import SessionState, StatePort

HANDOFF_KEY: Final = "handoff"
"""The state-bag key of the session's holder."""
PREFIX: Final = "transfer_to_"


class Handoff(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds the session, as the state bag keeps it."""

    agent: str
    """The agent the session's next runs go to."""
    by: str
    """The agent that handed it over."""
    run_id: str
    """The run whose call handed it over."""
    reason: str = ""
    """Why, as the model put it."""
    at: datetime
    """When (UTC)."""


class HandoffTools:
    """`transfer_to_<agent>` for each agent the run's agent may hand the session to."""

    urgent = True  # the state bag is written by the call: its result is stored at once

    def __init__(
        self, agent: AgentSpec, ctx: RunContext, session: asyncio.Future[SessionState]
    ) -> None:
        self.agent = agent
        self.ctx = ctx
        self.session = session
        self.by_name = {f"{PREFIX}{name}": name for name in agent.handoffs}

    async def tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name=name,
                description=(
                    f"Hand the conversation to the {target!r} agent: it answers the user from "
                    "the next message on. Tell the user first, in the same reply."
                ),
                parameters={
                    "type": "object",
                    "properties": {"reason": {"type": "string", "description": "Why."}},
                },
            )
            for name, target in self.by_name.items()
        ]

    def handles(self, name: str) -> bool:
        return name in self.by_name

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        target = self.by_name[call.name]
        reason = call.arguments.get("reason")
        handoff = Handoff(
            agent=target,
            by=self.agent.name,
            run_id=self.ctx.run_id,
            reason=reason[:1024] if isinstance(reason, str) else "",
            at=datetime.now(UTC),
        )
        state = await self.session
        value = msgspec.to_builtins(handoff)
        await state.change(HANDOFF_KEY, lambda _: (value, None))
        text = f"the conversation is now with the {target!r} agent"
        return ToolInvoked(
            result=FunctionResultContent(call_id=call.call_id, result=text),
            outcome="terminate",
            untrusted=False,
        )


def holder(record_state: Mapping[str, Any]) -> Handoff | None:
    """The session's holder, from its state bag (None when nobody was handed it)."""
    raw = record_state.get(HANDOFF_KEY)
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, Handoff)
    except msgspec.ValidationError:
        return None


async def session_agent(
    ports: StatePort, ctx: RunContext, addressed: AgentSpec, agents: Mapping[str, AgentSpec]
) -> AgentSpec:
    """The agent a run addressed to `addressed` goes to: the session's holder when the
    addressed agent takes part in handoffs (it names some, or some agent names it), else the
    addressed agent itself. A holder that holds for one run (`handoff_holds = "run"`) gives
    the session back as it takes this run."""
    if not _takes_part(addressed, agents.values()):
        return addressed
    try:
        record = await ports.get_session(ctx)
    except RemoteError as exc:
        if exc.known_code == "not_found":
            return addressed  # a new session: nobody holds it
        raise
    held = holder(record.state)
    if held is None or held.agent == addressed.name or held.agent not in agents:
        return addressed
    agent = agents[held.agent]
    if agent.handoff_holds == "run":
        state = SessionState(ports, ctx, record)
        await state.change(HANDOFF_KEY, lambda _: (None, None))
    return agent


def _takes_part(agent: AgentSpec, agents: Iterable[AgentSpec]) -> bool:
    return bool(agent.handoffs) or any(agent.name in other.handoffs for other in agents)
