"""The A2A SDK's request handler over runbus: each method makes the client-API calls and run
requests any runbus client makes, on the caller's own bus connection (the gateway decides what
is theirs: another user's run is `not_found`, hence `TaskNotFoundError`).

The route puts the caller's client and the agent its URL names in the call context's state
(`RunbusCall`); the SDK's v0.3 adapter wraps this handler for the v0.3 method names.
"""

import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Final

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf import json_format

from runbus import ops, session_ids
from runbus.client import RunbusClient, SequencedEvent, new_run_id
from runbus.messages import RunApprovalRequested, RunPaused, RunResumed, is_identifier
from runbus.messages.runs import (
    ApprovalDecide,
    RunCancel,
    RunEdit,
    RunGet,
    RunInfo,
    RunList,
    RunRecord,
    RunResume,
)

from .a2a_tasks import (
    INTERRUPTED,
    STATE_BY_STATUS,
    TERMINAL,
    TaskUpdates,
    apply,
    new_task,
    run_input,
    task_of_record,
)

STATE_KEY: Final = "runbus"
ENDED: Final = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class RunbusCall:
    """What one A2A call runs with: the caller's client and the agent of the endpoint."""

    client: RunbusClient
    agent: str
    idle_timeout: float


def _call(context: ServerCallContext) -> RunbusCall:
    call = context.state[STATE_KEY]
    assert isinstance(call, RunbusCall)
    return call


async def _scoped(context_id: str, call: RunbusCall) -> str:
    """The caller's own session of a `contextId` (docs/security.md): any client may name any
    context, so it never reaches another user's session. Tasks show the context as the caller
    named it (`session_ids.unscoped`), and it names the same session again."""
    me = await call.client.identity()
    return session_ids.scoped(me.tenant, me.user_id, context_id)


def _identifier(value: str, name: str) -> str:
    if not is_identifier(value):
        raise InvalidParamsError(f"bad {name} {value!r}: letters, digits, `_` and `-`, at most 128")
    return value


def _trimmed(task: Task, history_length: int | None) -> Task:
    if history_length is not None and len(task.history) > history_length:
        del task.history[: len(task.history) - history_length]
    return task


class RunbusRequestHandler(RequestHandler):
    """A2A's operations, each a runbus run or client-API call."""

    async def _start(
        self, params: SendMessageRequest, call: RunbusCall
    ) -> tuple[Task, AsyncGenerator[SequencedEvent, None]]:
        message = params.message
        if message.task_id:
            return await self._answer(message, call)
        messages = run_input(message)
        # A new context is the caller's too: the id sent back with the next message names it.
        session_id = await _scoped(message.context_id or f"s-{uuid.uuid4().hex[:16]}", call)
        run_id, trace_id = await call.client.start_traced(
            call.agent, messages, session_id=session_id, run_id=new_run_id()
        )
        task = new_task(run_id, session_ids.unscoped(session_id), message)
        task.metadata.update({"runbus": {"agent": call.agent, "trace_id": trace_id}})
        # Read from the events stream's first event: nothing published before is missed.
        events = call.client.follow(run_id, timeout=call.idle_timeout)
        return task, events

    async def _answer(
        self, message: Message, call: RunbusCall
    ) -> tuple[Task, AsyncGenerator[SequencedEvent, None]]:
        """A message to a task that is `input-required`: to a run its owner paused, its text
        is a note the model reads next and the run goes on from its pause; to a run waiting
        for approval, it is the owner's decision (approved, the text its note; a data part
        `{"decision": "denied"}` denies) on each call that waits."""
        info = await self._info(message.task_id, call)
        record = info.record
        if record.status == "waiting_approval" and info.pending_approvals:
            return await self._decide(message, call, record, info.pending_approvals)
        if record.status != "paused":
            raise UnsupportedOperationError(
                "a message continues a task only while it is input-required (its run paused or"
                " waiting for approval); otherwise each message starts a new runbus task:"
                " continue the conversation with its contextId"
            )
        note = "\n".join(m.text for m in run_input(message))
        edited = await call.client.call(
            ops.API_RUNS_EDIT, RunEdit(run_id=record.run_id, add=[note])
        )
        # The pause is told in the replay by its step and whether it held a model's reply.
        held = any(m.role == "assistant" for m in edited.messages)
        await call.client.call(ops.API_RUNS_RESUME, RunResume(run_id=record.run_id))
        task = new_task(record.run_id, session_ids.unscoped(record.session_id), message)
        events = call.client.follow(record.run_id, timeout=call.idle_timeout)
        return task, _after_the_pause(events, (edited.step, held))

    async def _decide(
        self, message: Message, call: RunbusCall, record: RunRecord, pending: list[str]
    ) -> tuple[Task, AsyncGenerator[SequencedEvent, None]]:
        # The decision may come as data (`{"decision": "denied"}`), which a run's input may not.
        note = "\n".join(p.text for p in message.parts if p.HasField("text"))
        denied = any(
            json_format.MessageToDict(p.data).get("decision") == "denied"
            for p in message.parts
            if p.HasField("data")
        )
        for call_id in pending:
            decide = ApprovalDecide(
                run_id=record.run_id,
                call_id=call_id,
                decision="denied" if denied else "approved",
                note=note[:1024],
            )
            await call.client.call(ops.API_APPROVALS_DECIDE, decide)
        task = new_task(record.run_id, session_ids.unscoped(record.session_id), message)
        events = call.client.follow(record.run_id, timeout=call.idle_timeout)
        return task, _after_the_decisions(events, set(pending))

    async def _info(self, run_id: str, call: RunbusCall) -> RunInfo:
        _identifier(run_id, "task id")
        info = await call.client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        if info.record.agent != call.agent:
            raise TaskNotFoundError(f"no task {run_id!r} of agent {call.agent!r}")
        return info

    async def _record(self, run_id: str, call: RunbusCall) -> RunRecord:
        return (await self._info(run_id, call)).record

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """Run the agent until the task ends or waits for a person (or at once with
        `returnImmediately`), and answer the task."""
        call = _call(context)
        task, events = await self._start(params, call)
        history_length = (
            params.configuration.history_length
            if params.configuration.HasField("history_length")
            else None
        )
        async with aclosing(events):
            if params.configuration.return_immediately:
                return _trimmed(task, history_length)
            updates = TaskUpdates(task.id, task.context_id)
            async for item in events:
                for update in updates.translate(item.event):
                    apply(task, update)
                if task.status.state in TERMINAL | INTERRUPTED:
                    break
        return _trimmed(task, history_length)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        """The task as submitted, then its status and artifact updates until it ends."""
        call = _call(context)
        task, events = await self._start(params, call)
        yield task
        async with aclosing(events):
            async for update in _updates(TaskUpdates(task.id, task.context_id), events):
                yield update

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        return task_of_record(await self._record(params.id, _call(context)))

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        call = _call(context)
        await self._record(params.id, call)
        info = await call.client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=params.id))
        if info.record.status in ENDED:
            raise TaskNotCancelableError(f"task {params.id!r} has ended ({info.record.status})")
        return task_of_record(info.record)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        """The task as it stands, then its updates from the run's first event on."""
        call = _call(context)
        record = await self._record(params.id, call)
        if record.status in ENDED:
            raise UnsupportedOperationError(f"task {params.id!r} has ended ({record.status})")
        yield task_of_record(record)
        events = call.client.follow(record.run_id, timeout=call.idle_timeout)
        async with aclosing(events):
            context_id = session_ids.unscoped(record.session_id)
            async for update in _updates(TaskUpdates(record.run_id, context_id), events):
                yield update

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """The caller's newest tasks of this agent (one page: `pageToken` is not supported)."""
        call = _call(context)
        if params.page_token:
            raise UnsupportedOperationError("runbus lists one page of tasks, the newest")
        session_id = await _scoped(params.context_id, call) if params.context_id else None
        size = params.page_size if params.HasField("page_size") else 50
        if not 1 <= size <= 100:
            raise InvalidParamsError(f"bad pageSize {size}: from 1 to 100")
        listed = await call.client.call(
            ops.API_RUNS_LIST, RunList(session_id=session_id, limit=1000)
        )
        tasks = [
            task_of_record(record)
            for record in listed.records
            if record.agent == call.agent
            and (not params.status or STATE_BY_STATUS[record.status] == params.status)
        ][:size]
        if not params.include_artifacts:
            for task in tasks:
                del task.artifacts[:]
        return ListTasksResponse(tasks=tasks, page_size=size, total_size=len(tasks))

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


async def _after_the_pause(
    events: AsyncGenerator[SequencedEvent, None], pause: tuple[int, bool]
) -> AsyncGenerator[SequencedEvent, None]:
    """The run's events from the resume of `pause` (its step, whether it held a reply) on: the
    replay of everything before is skipped."""
    reached = going = False
    async with aclosing(events):
        async for item in events:
            event = item.event
            if isinstance(event, RunPaused) and (event.step, bool(event.calls)) == pause:
                reached = True
            elif isinstance(event, RunResumed) and reached:
                going = True
            if going:
                yield item


async def _after_the_decisions(
    events: AsyncGenerator[SequencedEvent, None], decided: set[str]
) -> AsyncGenerator[SequencedEvent, None]:
    """The run's events after the approval requests `decided` (call ids): the replay of
    everything up to them is skipped."""
    asked: set[str] = set()
    async with aclosing(events):
        async for item in events:
            if asked >= decided:
                yield item
            elif isinstance(item.event, RunApprovalRequested) and item.event.call_id in decided:
                asked.add(item.event.call_id)


async def _updates(
    updates: TaskUpdates, events: AsyncIterator[SequencedEvent]
) -> AsyncGenerator[Event, None]:
    async for item in events:
        for update in updates.translate(item.event):
            yield update


def as_dict(message: object) -> dict[str, object]:
    """A protobuf message as A2A's JSON (camelCase)."""
    result: dict[str, object] = json_format.MessageToDict(message)
    return result
