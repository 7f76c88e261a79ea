"""runbus runs as A2A tasks, NATS-free: an A2A message's text as a run's input, a run's events
as A2A task updates, and the task a run record or those updates make.

One run is one task: the task id is the run id, the context id the session id. The task's one
artifact, `answer`, is the run's answer: streamed text deltas append to it (a new assistant
message starts it afresh), and the final text replaces it when the run completes (with the
run's structured output as a data part, for an output format). Tool calls
and results are `working` status updates whose message carries the call as a data part; a call
waiting for a person's approval makes the task `input-required`, and so does a pause of its
owner's (`run.paused`, with the pending calls) until the run resumes (`working`).
"""

import json
from typing import Any, Final, assert_never

import msgspec
from a2a.types import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError
from google.protobuf import json_format

from runbus import session_ids
from runbus.messages import (
    ChatMessage,
    Content,
    ErrorInfo,
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolProgress,
    RunToolResult,
    TextContent,
)
from runbus.messages.runs import RunRecord, RunStatus

ANSWER: Final = "answer"
"""The artifact id of a task's answer."""

STATE_BY_STATUS: Final[dict[RunStatus, int]] = {
    "queued": TaskState.TASK_STATE_SUBMITTED,
    "running": TaskState.TASK_STATE_WORKING,
    "waiting_approval": TaskState.TASK_STATE_INPUT_REQUIRED,
    "paused": TaskState.TASK_STATE_INPUT_REQUIRED,
    "completed": TaskState.TASK_STATE_COMPLETED,
    "failed": TaskState.TASK_STATE_FAILED,
    "cancelled": TaskState.TASK_STATE_CANCELED,
}

TERMINAL: Final = frozenset(
    {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED}
)
INTERRUPTED: Final = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED})
"""States a blocking `SendMessage` returns in, as in a terminal one: the run waits for a person."""

Update = TaskStatusUpdateEvent | TaskArtifactUpdateEvent


def run_input(message: Message) -> list[ChatMessage]:
    """The run's input: the message's text parts, in order, as one user message. Any other
    part is refused rather than dropped, so nothing the caller sent goes silently unread."""
    if message.role != Role.ROLE_USER:
        raise InvalidParamsError("the message must have role ROLE_USER")
    texts: list[Content] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind != "text":
            raise ContentTypeNotSupportedError(
                f"runbus takes text parts only; this message has a {kind or 'empty'} part"
            )
        if part.text.strip():
            texts.append(TextContent(text=part.text))
    if not texts:
        raise InvalidParamsError("the message has no text")
    return [ChatMessage(role="user", contents=texts)]


def state_of_failure(error: ErrorInfo) -> int:
    if error.known_code == "cancelled":
        return TaskState.TASK_STATE_CANCELED
    return TaskState.TASK_STATE_FAILED


def _json(value: Any) -> Any:
    """`value` as plain JSON (a tool's result may hold anything msgspec or str can write)."""
    return json.loads(json.dumps(msgspec.to_builtins(value), default=str))


def _data_part(value: Any) -> Part:
    part = Part()
    json_format.ParseDict(_json(value), part.data)
    return part


def agent_message(
    task_id: str, context_id: str, message_id: str, parts: list[Part], **runbus: Any
) -> Message:
    """An agent message of the task; `runbus` goes in its metadata (the event's type, …)."""
    message = Message(
        message_id=message_id,
        task_id=task_id,
        context_id=context_id,
        role=Role.ROLE_AGENT,
        parts=parts,
    )
    if runbus:
        message.metadata.update({"runbus": _json(runbus)})
    return message


def error_message(task_id: str, context_id: str, error: ErrorInfo) -> Message:
    return agent_message(
        task_id,
        context_id,
        f"{task_id}:error",
        [Part(text=error.message)],
        code=error.code,
        details=error.details,
    )


def answer(text: str, output: Any = None) -> Artifact:
    """The answer artifact: its text, and a run's structured output as a data part."""
    parts = [Part(text=text)]
    if output is not None:
        parts.append(_data_part(output))
    return Artifact(artifact_id=ANSWER, name=ANSWER, parts=parts)


class TaskUpdates:
    """runbus run events → A2A task updates, one run at a time (it remembers which assistant
    message the answer holds)."""

    def __init__(self, task_id: str, context_id: str) -> None:
        self.task_id = task_id
        self.context_id = context_id
        self.streaming: str | None = None
        """The assistant message whose deltas the answer artifact holds."""

    def status(self, state: int, message: Message | None = None) -> TaskStatusUpdateEvent:
        status = TaskStatus(state=state)  # type: ignore[arg-type]
        if message is not None:
            status.message.CopyFrom(message)
        return TaskStatusUpdateEvent(
            task_id=self.task_id, context_id=self.context_id, status=status
        )

    def artifact(
        self, text: str, *, append: bool, last: bool, output: Any = None
    ) -> TaskArtifactUpdateEvent:
        return TaskArtifactUpdateEvent(
            task_id=self.task_id,
            context_id=self.context_id,
            artifact=answer(text, output),
            append=append,
            last_chunk=last,
        )

    def translate(self, event: RunEvent) -> list[Update]:
        working = TaskState.TASK_STATE_WORKING
        match event:
            case RunStarted(session_id=session_id):
                self.context_id = session_ids.unscoped(session_id)
                return [self.status(working)]
            case RunTextDelta(message_id=message_id, delta=delta):
                append = self.streaming == message_id
                self.streaming = message_id
                return [self.artifact(delta, append=append, last=False)]
            case RunToolCall(call=call):
                part = _data_part({"tool_call": call})
                message_id = f"{self.task_id}:{call.call_id}:call"
                message = agent_message(
                    self.task_id, self.context_id, message_id, [part], type="run.tool_call"
                )
                return [self.status(working, message)]
            case RunToolResult(result=result):
                part = _data_part({"tool_result": result})
                message_id = f"{self.task_id}:{result.call_id}:result"
                message = agent_message(
                    self.task_id, self.context_id, message_id, [part], type="run.tool_result"
                )
                return [self.status(working, message)]
            case RunToolProgress(call_id=call_id, text=text, state=state):
                parts = [_data_part({"tool_progress": event})]
                if text:
                    parts.insert(0, Part(text=text))
                message_id = f"{self.task_id}:{call_id}:progress:{state}:{len(text)}"
                message = agent_message(
                    self.task_id, self.context_id, message_id, parts, type="run.tool_progress"
                )
                return [self.status(working, message)]
            case RunApprovalRequested():
                decide = f"POST /v1/runs/{event.run_id}/approvals/{event.call_id}"
                text = (
                    f"{event.tool} asks: {event.reason} (answer with {decide},"
                    ' {"decision": "approved", "note": "<the answer>"})'
                    if event.question
                    else f"{event.tool} needs a person's approval ({event.reason}): decide with"
                    f" {decide}"
                )
                message = agent_message(
                    self.task_id,
                    self.context_id,
                    f"{self.task_id}:{event.call_id}:approval",
                    [Part(text=text), _data_part({"approval_requested": event})],
                    type="run.approval_requested",
                )
                return [self.status(TaskState.TASK_STATE_INPUT_REQUIRED, message)]
            case RunCompleted(text=text, usage=usage, output=output):
                done = self.status(TaskState.TASK_STATE_COMPLETED)
                done.metadata.update({"runbus": _json({"usage": usage})})
                return [self.artifact(text, append=False, last=True, output=output), done]
            case RunFailed(error=error):
                message = error_message(self.task_id, self.context_id, error)
                return [self.status(state_of_failure(error), message)]
            case RunPaused(calls=calls):
                text = (
                    f"paused by its owner before {len(calls)} tool call(s): edit with"
                    f" POST /v1/runs/{event.run_id}/edit, go on with"
                    f" POST /v1/runs/{event.run_id}/resume, or send this task a message: the"
                    " model reads it and the run goes on"
                )
                message = agent_message(
                    self.task_id,
                    self.context_id,
                    f"{self.task_id}:paused:{event.step}",
                    [Part(text=text), _data_part({"paused": event})],
                    type="run.paused",
                )
                return [self.status(TaskState.TASK_STATE_INPUT_REQUIRED, message)]
            case RunResumed():
                return [self.status(working)]
            case RunCompacted():
                return []  # the run's own housekeeping: A2A has no update for it
            case _:
                assert_never(event)


def new_task(task_id: str, context_id: str, request: Message) -> Task:
    """The task of a run just requested: submitted, its history the caller's message."""
    task = Task(
        id=task_id,
        context_id=context_id,
        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
    )
    sent = Message()
    sent.CopyFrom(request)
    sent.task_id = task_id
    sent.context_id = context_id
    task.history.append(sent)
    return task


def apply(task: Task, update: Update) -> None:
    """Fold one update into the task, as a client that follows the stream sees it."""
    if isinstance(update, TaskStatusUpdateEvent):
        task.status.CopyFrom(update.status)
        if update.HasField("metadata"):
            task.metadata.update(json_format.MessageToDict(update.metadata))
        return
    for artifact in task.artifacts:
        if artifact.artifact_id == update.artifact.artifact_id:
            if update.append:
                artifact.parts.extend(update.artifact.parts)
            else:
                artifact.CopyFrom(update.artifact)
            return
    task.artifacts.append(update.artifact)


def task_of_record(record: RunRecord) -> Task:
    """The task a run record shows: its state, the answer once completed, the error once
    failed or cancelled."""
    state = STATE_BY_STATUS[record.status]
    # The caller's context as they named it: their own session of it is what they hold.
    context_id = session_ids.unscoped(record.session_id)
    task = Task(id=record.run_id, context_id=context_id)
    task.status.state = state  # type: ignore[assignment]
    task.status.timestamp.FromDatetime(record.updated_at)
    if record.error is not None and state in TERMINAL:
        task.status.message.CopyFrom(error_message(record.run_id, context_id, record.error))
    if record.status == "completed":
        task.artifacts.append(answer(record.text or "", record.output))
    about: dict[str, str | int] = {"agent": record.agent, "attempts": record.attempts}
    if record.trace_id:
        about["trace_id"] = record.trace_id
    task.metadata.update({"runbus": about})
    return task
