"""Every mapping of run events to a client's stream (AG-UI, A2A, OpenAI chat completions and
responses, the runs API's SSE and JSON, the CLI) handles every member of `RunEvent`.

The members come from the union itself and their samples from the golden wire files, so a new
event type fails here until it has a sample and each table below says what it becomes. Each
mapping's `match` ends in `assert_never`: an event no case names raises instead of vanishing.
"""

import io
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Final, get_args

import msgspec
import pytest
from a2a.types import TaskArtifactUpdateEvent, TaskState

from runbus.client import SequencedEvent
from runbus.errors import Unavailable
from runbus.messages import RunCompleted, RunEvent, RunFailed, RunTextDelta
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus.render import EventPrinter, waiting_on
from runbus_ingress import runs as runs_api
from runbus_ingress import sse
from runbus_ingress.a2a_tasks import TaskUpdates
from runbus_ingress.agui import Translator
from runbus_ingress.errors import status_of
from runbus_ingress.openai_chat import Completion, _whole
from runbus_ingress.responses import Response

GOLDEN_DIR: Final = Path(__file__).parents[1] / "contract" / "golden"

TAGS: Final = sorted(str(member.__struct_config__.tag) for member in get_args(RunEvent))
"""The wire tag of every member of the `RunEvent` union."""


def samples(tag: str) -> list[RunEvent]:
    files = [GOLDEN_DIR / f"{tag}.json", *sorted(GOLDEN_DIR.glob(f"{tag}--*.json"))]
    found = [RUN_EVENT_DECODER.decode(path.read_bytes()) for path in files if path.exists()]
    assert found, f"no golden sample of {tag!r}: add tests/contract/golden/{tag}.json"
    return found


AGUI: Final[dict[str, list[str]]] = {
    "run.started": ["RUN_STARTED"],
    "run.approval_requested": ["CUSTOM"],
    "run.paused": ["CUSTOM"],
    "run.resumed": ["CUSTOM"],
    "run.compacted": [],
    "run.text_delta": ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"],
    "run.tool_call": ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"],
    "run.tool_result": ["TOOL_CALL_RESULT"],
    "run.tool_progress": ["CUSTOM"],
    "run.completed": ["RUN_FINISHED"],
    "run.failed": ["RUN_ERROR"],
}
"""The AG-UI events each run event becomes."""

A2A: Final[dict[str, list[str]]] = {
    "run.started": ["TASK_STATE_WORKING"],
    "run.approval_requested": ["TASK_STATE_INPUT_REQUIRED"],
    "run.paused": ["TASK_STATE_INPUT_REQUIRED"],
    "run.resumed": ["TASK_STATE_WORKING"],
    "run.compacted": [],
    "run.text_delta": ["artifact"],
    "run.tool_call": ["TASK_STATE_WORKING"],
    "run.tool_result": ["TASK_STATE_WORKING"],
    "run.tool_progress": ["TASK_STATE_WORKING"],
    "run.completed": ["artifact", "TASK_STATE_COMPLETED"],
    "run.failed": ["TASK_STATE_FAILED"],
}
"""The A2A task updates each run event becomes: an artifact chunk or a status of this state."""

OPENAI_STREAM: Final[dict[str, tuple[int, bool]]] = {
    "run.started": (0, False),
    "run.approval_requested": (0, False),  # a change of a known call only: none is known here
    "run.paused": (0, False),
    "run.resumed": (0, False),
    "run.compacted": (0, False),
    "run.text_delta": (1, False),
    "run.tool_call": (1, False),
    "run.tool_result": (1, False),
    "run.tool_progress": (0, False),
    "run.completed": (2, True),  # the finish chunk, then usage (asked for)
    "run.failed": (1, True),
}
"""How many chunks a streamed chat completion sends for each event, and whether it ends."""

_CLOSE: Final = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]
_OPEN: Final = ["response.output_item.added", "response.content_part.added"]

RESPONSES_STREAM: Final[dict[str, list[str]]] = {
    "run.started": [],
    "run.approval_requested": _CLOSE,  # server-side tools: the message before one is finished
    "run.paused": [],
    "run.resumed": [],
    "run.compacted": [],
    "run.text_delta": [*_CLOSE, *_OPEN, "response.output_text.delta"],  # another message's
    "run.tool_call": _CLOSE,
    "run.tool_result": _CLOSE,
    "run.tool_progress": [],
    "run.completed": [*_CLOSE, "response.completed"],
    "run.failed": [*_CLOSE, "response.failed"],
}
"""The Responses API stream events each run event becomes while a message is being streamed."""

FINAL: Final = frozenset({"run.completed", "run.failed"})
"""The events that end a run: a whole (non-streamed) answer is built from one of them."""

PRINTED: Final = frozenset(TAGS) - {"run.started"}
"""The events the CLI prints a line for."""


def test_every_table_says_what_every_run_event_becomes() -> None:
    for table in (AGUI, A2A, OPENAI_STREAM, RESPONSES_STREAM):
        assert sorted(table) == TAGS
    assert set(TAGS) >= FINAL


@pytest.mark.parametrize("tag", TAGS)
def test_ag_ui_maps_every_run_event(tag: str) -> None:
    for event in samples(tag):
        translator = Translator("thread", "r-1")

        got = [e.type.value for e in translator.translate(event)]
        translator.todos_may_have_changed(event)

        assert got == AGUI[tag]


@pytest.mark.parametrize("tag", TAGS)
def test_a2a_maps_every_run_event(tag: str) -> None:
    for event in samples(tag):
        updates = TaskUpdates("task-1", "context-1").translate(event)

        got = [
            "artifact"
            if isinstance(update, TaskArtifactUpdateEvent)
            else TaskState.Name(update.status.state)
            for update in updates
        ]
        assert got == A2A[tag]


@pytest.mark.parametrize("tag", TAGS)
def test_a_streamed_chat_completion_maps_every_run_event(tag: str) -> None:
    for event in samples(tag):
        completion = Completion("travel", "r-1", "s-1", "0" * 32)

        frames, ends = completion.frames(event, include_usage=True)

        assert all(frame.startswith(b"data: ") for frame in frames)
        assert (len(frames), ends) == OPENAI_STREAM[tag]


def _kinds(frames: list[bytes]) -> list[str]:
    kinds = []
    for frame in frames:
        head, _, data = frame.removesuffix(b"\n\n").partition(b"\ndata: ")
        kind = msgspec.json.decode(data)["type"]
        assert head == b"event: " + kind.encode()
        kinds.append(kind)
    return kinds


@pytest.mark.parametrize("tag", TAGS)
def test_a_streamed_response_maps_every_run_event(tag: str) -> None:
    for event in samples(tag):
        response = Response("travel", "r-1", "s-1")
        opening = response.opening()
        response.frames(RunTextDelta(run_id="r-1", message_id="m-streaming", delta="Looking "))

        frames, ends = response.frames(event)

        assert _kinds(opening) == ["response.created", "response.in_progress"]
        assert _kinds(frames) == RESPONSES_STREAM[tag]
        assert ends == (tag in FINAL)


def test_a_response_whose_model_did_not_stream_still_sends_its_text_as_one_message() -> None:
    done = samples("run.completed")[0]
    assert isinstance(done, RunCompleted)
    response = Response("travel", "r-1", "s-1")

    frames, ends = response.frames(done)

    assert _kinds(frames) == [*_OPEN, "response.output_text.delta", *_CLOSE, "response.completed"]
    completed = msgspec.json.decode(frames[-1].partition(b"\ndata: ")[2])["response"]
    assert completed["output"][0]["content"][0]["text"] == done.text
    assert ends


async def _events(event: RunEvent) -> AsyncGenerator[SequencedEvent, None]:
    yield SequencedEvent(seq=1, event=event)


@pytest.mark.parametrize("tag", TAGS)
async def test_a_whole_answer_is_built_from_a_final_event_and_only_from_one(tag: str) -> None:
    """Chat completions without `stream`, and the runs API's `wait` answer."""
    for event in samples(tag):
        completion = Completion("travel", "r-1", "s-1", "0" * 32)
        if tag not in FINAL:
            with pytest.raises(Unavailable):
                await _whole(completion, _events(event), {})
            with pytest.raises(Unavailable):
                await runs_api._final(_events(event), {})
            continue

        whole = await _whole(completion, _events(event), {})
        waited = await runs_api._final(_events(event), {})

        expected = status_of(event.error.code) if isinstance(event, RunFailed) else 200
        assert whole.status == waited.status == expected


@pytest.mark.parametrize("tag", TAGS)
def test_the_sse_frame_of_every_run_event_names_its_type_and_carries_it(tag: str) -> None:
    for event in samples(tag):
        frame = sse.frame(7, event)

        head, _, data = frame.removesuffix(b"\n\n").partition(b"\ndata: ")
        assert head == b"id: 7\nevent: " + tag.encode()
        assert RUN_EVENT_DECODER.decode(data) == event


@pytest.mark.parametrize("tag", TAGS)
def test_the_cli_renders_every_run_event(tag: str) -> None:
    for event in samples(tag):
        out = io.StringIO()

        EventPrinter(out)(event)

        assert bool(out.getvalue()) == (tag in PRINTED)
        assert waiting_on(event)


def test_a_streamed_failure_carries_the_run_s_error_code() -> None:
    (failed,) = samples("run.failed")
    assert isinstance(failed, RunFailed)

    frames, _ = Completion("travel", "r-1", "s-1", "0" * 32).frames(failed, include_usage=False)

    (body,) = frames
    error = msgspec.json.decode(body.removeprefix(b"data: "))["error"]
    assert error["code"] == failed.error.code
