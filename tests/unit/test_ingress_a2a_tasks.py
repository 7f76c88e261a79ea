"""runbus runs as A2A tasks: what a message becomes as run input, and what a run's events and
its record make of the task."""

from datetime import UTC, datetime

import pytest
from a2a.types import Message, Part, Role, Task, TaskState
from a2a.utils.errors import ContentTypeNotSupportedError, InvalidParamsError

from runbus.messages import (
    ErrorInfo,
    FunctionCallContent,
    FunctionResultContent,
    RunApprovalRequested,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolResult,
    TextContent,
)
from runbus.messages.runs import RunRecord, RunStatus
from runbus_ingress.a2a_tasks import TaskUpdates, apply, new_task, run_input, task_of_record

RUN = "r-1"


def user(*parts: Part, role: int = Role.ROLE_USER) -> Message:
    return Message(message_id="m-1", role=role, parts=list(parts))  # type: ignore[arg-type]


def folded(events: list[RunEvent]) -> Task:
    task = new_task(RUN, "s-1", user(Part(text="hi")))
    updates = TaskUpdates(RUN, "s-1")
    for event in events:
        for update in updates.translate(event):
            apply(task, update)
    return task


def answer(task: Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts)


def test_the_text_parts_are_one_user_message_in_order() -> None:
    (message,) = run_input(user(Part(text="Weather"), Part(text=" "), Part(text="in Sydney?")))

    assert message.role == "user"
    assert message.contents == [TextContent(text="Weather"), TextContent(text="in Sydney?")]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (user(Part(text="hi"), Part(url="https://x.invalid/a.png")), ContentTypeNotSupportedError),
        (user(Part(text="  ")), InvalidParamsError),
        (user(Part(text="hi"), role=Role.ROLE_AGENT), InvalidParamsError),
    ],
)
def test_a_message_runbus_cannot_run_is_refused_not_trimmed(
    message: Message, error: type[Exception]
) -> None:
    with pytest.raises(error):
        run_input(message)


def test_a_completed_run_makes_a_completed_task_whose_answer_is_the_final_text() -> None:
    call = FunctionCallContent(call_id="c1", name="get_weather", arguments={"city": "Sydney"})
    task = folded(
        [
            RunStarted(run_id=RUN, session_id="s-1", agent="travel"),
            RunTextDelta(run_id=RUN, message_id="m0", delta="Let me "),
            RunTextDelta(run_id=RUN, message_id="m0", delta="look."),
            RunToolCall(run_id=RUN, call=call),
            RunToolResult(run_id=RUN, result=FunctionResultContent(call_id="c1", result=24)),
            RunTextDelta(run_id=RUN, message_id="m1", delta="24°C"),
            RunCompleted(run_id=RUN, response=[], text="It's 24°C."),
        ]
    )

    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert answer(task) == "It's 24°C."
    assert [m.parts[0].text for m in task.history] == ["hi"]


def test_the_streamed_answer_holds_the_current_assistant_message_only() -> None:
    task = folded(
        [
            RunTextDelta(run_id=RUN, message_id="m0", delta="Let me "),
            RunTextDelta(run_id=RUN, message_id="m0", delta="look."),
            RunTextDelta(run_id=RUN, message_id="m1", delta="24"),
            RunTextDelta(run_id=RUN, message_id="m1", delta="°C"),
        ]
    )

    assert answer(task) == "24°C"


def test_a_call_waiting_for_approval_makes_the_task_input_required() -> None:
    waiting = RunApprovalRequested(
        run_id=RUN,
        call_id="c1",
        tool="create_booking",
        arguments={},
        reason="over the limit",
        expires_at=0.0,
    )
    task = folded([waiting])

    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert f"/v1/runs/{RUN}/approvals/c1" in task.status.message.parts[0].text


@pytest.mark.parametrize(
    ("code", "state"),
    [("cancelled", TaskState.TASK_STATE_CANCELED), ("model_error", TaskState.TASK_STATE_FAILED)],
)
def test_a_failed_run_says_why_in_the_status_message(code: str, state: int) -> None:
    task = folded([RunFailed(run_id=RUN, error=ErrorInfo(code=code, message="why"))])

    assert task.status.state == state
    assert task.status.message.parts[0].text == "why"
    assert task.status.message.metadata["runbus"]["code"] == code


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("queued", TaskState.TASK_STATE_SUBMITTED),
        ("running", TaskState.TASK_STATE_WORKING),
        ("waiting_approval", TaskState.TASK_STATE_INPUT_REQUIRED),
        ("completed", TaskState.TASK_STATE_COMPLETED),
        ("failed", TaskState.TASK_STATE_FAILED),
        ("cancelled", TaskState.TASK_STATE_CANCELED),
    ],
)
def test_a_run_record_shows_as_the_task_in_the_same_state(status: RunStatus, state: int) -> None:
    now = datetime.now(UTC)
    record = RunRecord(
        run_id=RUN,
        agent="travel",
        session_id="s-1",
        tenant="acme",
        user_id="alice",
        status=status,
        created_at=now,
        updated_at=now,
        text="done" if status == "completed" else None,
    )
    task = task_of_record(record)

    assert (task.id, task.context_id, task.status.state) == (RUN, "s-1", state)
    assert answer(task) == ("done" if status == "completed" else "")
