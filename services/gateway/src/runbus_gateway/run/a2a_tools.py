"""Remote A2A agents as tools (`[[remote_agents]]`): a call sends the model's `input` as one
A2A message with the a2a-sdk client and follows the task it starts (`a2a_task.py`) — its
status updates the run's progress events, its answer the call's result. A task that needs
input pauses the run as an approval does: the run's owner answers (approve with a note: the
note is sent; deny: the task is cancelled). A cancelled run, or one past its deadline or the
agent's timeout, cancels the task."""

import asyncio
import hashlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

import httpx
import structlog
from a2a.client.errors import A2AClientError
from a2a.utils.errors import A2AError

from runbus.headers import RunContext
from runbus.messages import FunctionCallContent, FunctionResultContent, ToolSpec
from runbus.messages.tools import ApprovalRequest, ToolInvoked

from ..agents import RemoteAgent
from .a2a_task import RemoteAgentError, RemoteTask, RemoteTaskRef
from .agent_tools import INPUT_SCHEMA
from .events import RunEvents
from .ports import RunPorts
from .toolsets import OnWaiting

ANSWER_WITHIN: Final = 3600.0
"""Seconds the run's owner has to answer a remote agent's question."""

log = structlog.get_logger()


@runtime_checkable
class RemoteTaskPorts(Protocol):
    """Where a call's remote task is remembered, for a run resumed after its gateway died
    (the bus adapters keep it in KV under the run's owner)."""

    async def remote_task(self, ctx: RunContext, call_id: str) -> RemoteTaskRef | None: ...

    async def remember_remote_task(
        self, ctx: RunContext, call_id: str, ref: RemoteTaskRef
    ) -> None: ...


class RemoteAgents:
    """The remote A2A agents a run may call, each as a tool taking one `input`."""

    urgent = True  # nothing records the remote task by call id: store its answer at once

    def __init__(
        self,
        agents: Sequence[RemoteAgent],
        ports: RunPorts,
        events: RunEvents,
        waiting: set[str],
        on_waiting: OnWaiting | None,
    ) -> None:
        self.by_name = {a.name: a for a in agents}
        self.ports = ports
        self.events = events
        self.waiting = waiting
        self.on_waiting = on_waiting

    @property
    def ctx(self) -> RunContext:
        return self.events.ctx

    async def tools(self) -> list[ToolSpec]:
        return [
            ToolSpec(
                name=name,
                description=agent.description or f"Ask the remote agent {name!r}.",
                parameters=INPUT_SCHEMA,
            )
            for name, agent in self.by_name.items()
        ]

    def handles(self, name: str) -> bool:
        return name in self.by_name

    async def call(self, call: FunctionCallContent, *, first_send: bool) -> ToolInvoked:
        agent = self.by_name[call.name]
        text = call.arguments.get("input")
        if not isinstance(text, str) or not text.strip():
            return _result(call, error="invalid_arguments: `input` must be the text to send")
        left = self.ctx.time_left()
        timeout = agent.timeout if left is None else max(0.0, min(agent.timeout, left))
        try:
            async with httpx.AsyncClient(headers=_auth(agent), timeout=timeout) as http:
                remote = RemoteTask(agent, call, http, self)
                try:
                    async with asyncio.timeout(timeout) as remote.budget:
                        answer = await remote.run(text, first_send=first_send)
                except TimeoutError:
                    await remote.cancel()
                    return _result(
                        call,
                        error=f"deadline_exceeded: {call.name!r} did not answer in {timeout:.0f}s",
                    )
                except BaseException:
                    await remote.cancel()
                    raise
        except (RemoteAgentError, A2AClientError, A2AError, httpx.HTTPError, OSError) as exc:
            log.info("remote_agent_failed", tool=call.name, url=agent.url, error=str(exc))
            return _result(call, error=f"remote agent {call.name!r}: {exc}")
        return _result(call, result=answer)

    async def recall(self, call: FunctionCallContent) -> RemoteTaskRef | None:
        """The task an earlier delivery of this run started for the call, if it said."""
        if not isinstance(self.ports, RemoteTaskPorts):
            return None
        return await self.ports.remote_task(self.ctx, call.call_id)

    async def remember(self, call: FunctionCallContent, ref: RemoteTaskRef) -> None:
        if isinstance(self.ports, RemoteTaskPorts):
            await self.ports.remember_remote_task(self.ctx, call.call_id, ref)

    async def ask_owner(self, call: FunctionCallContent, round_: int, question: str) -> str | None:
        """Pause as an approval does until the run's owner answers the remote agent's
        question: their note when they approve, None when they deny (or let it expire)."""
        # A call id of its own per question: each is decided once.
        asked = f"{call.call_id}-input{round_}"
        digest = hashlib.sha256(f"{self.ctx.run_id}\0{asked}\0{question}".encode()).hexdigest()
        request = ApprovalRequest(
            tool=call.name,
            arguments=call.arguments,
            reason=f"{call.name} asks: {question}"[:2048],
            expires_at=time.time() + ANSWER_WITHIN,
            digest=digest,
        )
        asking = FunctionCallContent(call_id=asked, name=call.name, arguments=call.arguments)

        async def announce() -> None:
            await self.events.approval_requested(asked, request)

        self.waiting.add(call.call_id)
        if self.on_waiting is not None:
            await self.on_waiting(True)
        try:
            grant = await self.ports.await_approval(self.ctx, asking, request, announce)
        finally:
            if self.on_waiting is not None:
                await self.on_waiting(False)
            self.waiting.discard(call.call_id)
        return grant.note if grant.decision == "approved" else None


def _auth(agent: RemoteAgent) -> dict[str, str]:
    """The bearer token from the agent's secret (an environment variable or a file, read
    at each call so a rotated secret is used at once)."""
    token = ""
    if agent.token_env:
        token = os.environ.get(agent.token_env, "")
    elif agent.token_file:
        token = Path(agent.token_file).read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _result(
    call: FunctionCallContent, *, result: str | None = None, error: str | None = None
) -> ToolInvoked:
    return ToolInvoked(
        result=FunctionResultContent(call_id=call.call_id, result=result, error=error)
    )
