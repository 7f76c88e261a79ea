"""One call's task at a remote A2A agent (`a2a_tools.RemoteAgents`), from the first message
to its answer: sent with the a2a-sdk client, followed while it streams (its status updates
become `run.tool_progress` events), its questions put to the run's owner, cancelled when the
call is given up. A task an earlier delivery of the run started is followed again, not sent
twice."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Final, Protocol

import httpx
import msgspec
import structlog
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import A2AError

from runbus.headers import RunContext
from runbus.messages import FunctionCallContent

from ..agents import RemoteAgent
from .events import RunEvents

PROGRESS_EVERY: Final = 0.5
"""Seconds between two stored progress events of one call (each is an fsynced write)."""
CANCEL_WITHIN: Final = 5.0
"""Seconds a cancel of the remote task may take before the run ends anyway."""
MAX_ROUNDS: Final = 8
"""Questions one call may ask the run's owner."""

FAILED: Final = {
    TaskState.TASK_STATE_FAILED: "failed",
    TaskState.TASK_STATE_CANCELED: "cancelled",
    TaskState.TASK_STATE_REJECTED: "rejected",
}
ENDED: Final = frozenset({TaskState.TASK_STATE_COMPLETED, *FAILED})
ASKING: Final = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})

log = structlog.get_logger()


class RemoteTaskRef(msgspec.Struct, frozen=True, kw_only=True):
    """The task a call started at a remote agent."""

    url: str
    """The agent's endpoint."""
    task_id: str
    context_id: str = ""


REMOTE_TASK_DECODER: Final = msgspec.json.Decoder(RemoteTaskRef)


class RemoteAgentError(Exception):
    """What the model reads when a remote agent did not answer."""


class TaskOwner(Protocol):
    """What a remote task needs of the toolset that runs it."""

    @property
    def ctx(self) -> RunContext: ...

    @property
    def events(self) -> RunEvents: ...

    async def recall(self, call: FunctionCallContent) -> RemoteTaskRef | None: ...

    async def remember(self, call: FunctionCallContent, ref: RemoteTaskRef) -> None: ...

    async def ask_owner(
        self, call: FunctionCallContent, round_: int, question: str
    ) -> str | None: ...


class RemoteTask:
    """One call's task at a remote agent, from the first message to its answer."""

    def __init__(
        self,
        agent: RemoteAgent,
        call: FunctionCallContent,
        http: httpx.AsyncClient,
        toolset: TaskOwner,
    ) -> None:
        self.agent = agent
        self.call = call
        self.http = http
        self.toolset = toolset
        self.client: Client | None = None
        self.task_id = ""
        self.context_id = ""
        self.artifacts: dict[str, str] = {}
        self.said = ""
        self.reading: asyncio.Future[TaskState] | None = None
        self.named = asyncio.Event()
        """Set once the agent has named its task."""
        self.remembered = False
        """Whether the task is recorded for a resumed run."""
        self.budget: asyncio.Timeout | None = None
        """The call's timeout (the agent's, or what the run's deadline leaves)."""
        self.reported = 0
        """Progress events stored for this call so far (`RunToolProgress`)."""
        self.reported_at = 0.0
        self.reported_state: TaskState = TaskState.TASK_STATE_UNSPECIFIED

    async def run(self, text: str, *, first_send: bool) -> str:
        card = await A2ACardResolver(self.http, self.agent.url).get_agent_card()
        self.client = ClientFactory(ClientConfig(httpx_client=self.http, streaming=True)).create(
            card
        )
        ctx = self.toolset.ctx
        # The same message id for every delivery of the run: an agent that dedupes sees one.
        message_id = f"{ctx.run_id}:{self.call.call_id}"
        started = None if first_send else await self.toolset.recall(self.call)
        if started is not None and started.url == self.agent.url:
            # Sent by a delivery of this run that died: follow that task, do not ask again.
            self.task_id, self.context_id = started.task_id, started.context_id
            self.remembered = True
            self.named.set()
            log.info("remote_agent_task_resumed", tool=self.call.name, task_id=self.task_id)
            state = await self._read(self._again())
        else:
            state = await self._read(self._send(message_id, text))
        for round_ in range(1, MAX_ROUNDS + 1):
            if state not in ASKING:
                break
            answer = await self._ask_owner(round_)
            if answer is None:
                await self.cancel()
                raise RemoteAgentError("it asked for input and the user declined to give it")
            state = await self._read(self._send(f"{message_id}:{round_}", answer))
        if state == TaskState.TASK_STATE_COMPLETED:
            return "".join(self.artifacts.values()) or self.said
        if state in FAILED:
            raise RemoteAgentError(f"its task {FAILED[state]}: {self.said or 'no reason given'}")
        raise RemoteAgentError(f"its task ended in state {TaskState.Name(state)}")

    async def _read(self, responses: AsyncIterator[StreamResponse]) -> TaskState:
        """`_follow` in a task of its own, so a cancel of the run does not stop it before the
        agent has named its task (which the cancel then needs)."""
        self.reading = asyncio.ensure_future(self._follow(responses))
        return await asyncio.shield(self.reading)

    async def _ask_owner(self, round_: int) -> str | None:
        """The owner's answer to the agent's question; the time a person takes does not count
        against the agent's timeout."""
        budget = self.budget
        when = budget.when() if budget is not None else None
        if budget is not None:
            budget.reschedule(None)
        started = asyncio.get_running_loop().time()
        try:
            return await self.toolset.ask_owner(self.call, round_, self.said or "more input")
        finally:
            if budget is not None and when is not None:
                budget.reschedule(when + asyncio.get_running_loop().time() - started)

    async def _again(self) -> AsyncIterator[StreamResponse]:
        """The task's updates from now on, or the task as it stands when it can no longer
        be followed (it ended)."""
        assert self.client is not None
        try:
            async for response in self.client.subscribe(SubscribeToTaskRequest(id=self.task_id)):
                yield response
        except (A2AClientError, A2AError, NotImplementedError):
            task = await self.client.get_task(GetTaskRequest(id=self.task_id))
            yield StreamResponse(task=task)

    def _send(self, message_id: str, text: str) -> AsyncIterator[StreamResponse]:
        assert self.client is not None
        message = Message(
            message_id=message_id,
            role=Role.ROLE_USER,
            parts=[Part(text=text)],
            task_id=self.task_id,
            context_id=self.context_id,
        )
        return self.client.send_message(SendMessageRequest(message=message))

    async def _follow(self, responses: AsyncIterator[StreamResponse]) -> TaskState:
        """Read the task's updates until it ends or asks for input; its state then."""
        state: TaskState = TaskState.TASK_STATE_UNSPECIFIED
        async for response in responses:
            match response.WhichOneof("payload"):
                case "message":  # a direct answer, no task
                    self.said = _text(response.message.parts)
                    return TaskState.TASK_STATE_COMPLETED
                case "task":
                    task = response.task
                    self.task_id, self.context_id = task.id, task.context_id
                    self.named.set()
                    for artifact in task.artifacts:
                        self.artifacts[artifact.artifact_id] = _text(artifact.parts)
                    state = self._status(task.status.state, task.status.message.parts)
                    await self._report(state, _text(task.status.message.parts))
                case "status_update":
                    update = response.status_update
                    self.task_id = update.task_id or self.task_id
                    self.named.set()
                    self.context_id = update.context_id or self.context_id
                    state = self._status(update.status.state, update.status.message.parts)
                    await self._report(state, _text(update.status.message.parts))
                case "artifact_update":
                    update_a = response.artifact_update
                    key, chunk = update_a.artifact.artifact_id, _text(update_a.artifact.parts)
                    self.artifacts[key] = (
                        self.artifacts.get(key, "") if update_a.append else ""
                    ) + chunk
            if self.named.is_set() and not self.remembered:
                self.remembered = True
                ref = RemoteTaskRef(
                    url=self.agent.url, task_id=self.task_id, context_id=self.context_id
                )
                await self.toolset.remember(self.call, ref)
            if state in ENDED or state in ASKING:
                return state
        return state

    def _status(self, state: TaskState, parts: Sequence[Part]) -> TaskState:
        if said := _text(parts):
            self.said = said
        log.info(
            "remote_agent_status",
            tool=self.call.name,
            call_id=self.call.call_id,
            task_id=self.task_id,
            state=TaskState.Name(state),
        )
        return state

    async def _report(self, state: TaskState, text: str) -> None:
        """A status of a task still working becomes the run's `run.tool_progress` (its end
        and its questions are the call's result and the owner's question instead). Each is
        a stored write: a new state is told at once, more of the same state at most once
        every PROGRESS_EVERY seconds, and a bare `submitted` not at all."""
        if state in ENDED or state in ASKING:
            return
        if state == TaskState.TASK_STATE_SUBMITTED and not text:
            return
        now = asyncio.get_running_loop().time()
        if state == self.reported_state and now - self.reported_at < PROGRESS_EVERY:
            return
        self.reported_at, self.reported_state = now, state
        self.reported += 1
        name = TaskState.Name(state).removeprefix("TASK_STATE_").lower()
        await self.toolset.events.tool_progress(
            self.call.call_id, self.call.name, name, text, number=self.reported
        )

    async def cancel(self) -> None:
        """Cancel the remote task (best effort, bounded): once the agent has named it, if it
        has not yet; then stop reading its updates."""
        try:
            if self.client is None or self.reading is None:
                return
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CANCEL_WITHIN):
                    await asyncio.shield(self.named.wait())
                    await asyncio.shield(
                        self.client.cancel_task(CancelTaskRequest(id=self.task_id))
                    )
                log.info("remote_agent_cancelled", tool=self.call.name, task_id=self.task_id)
        finally:
            if self.reading is not None:
                self.reading.cancel()


def _text(parts: Sequence[Part]) -> str:
    return "".join(p.text for p in parts if p.HasField("text"))
