"""Edits of a paused run's pending step and the cut of a fork, without a bus: an edit is
checked whole before any of it applies, arguments against the tool's schema; a fork keeps the
history the run started from and its first messages, and only compactions within them."""

from datetime import UTC, datetime

import pytest

from runbus.errors import BadRequest
from runbus.messages import ChatMessage, FunctionCallContent, TextContent, ToolSpec
from runbus.messages.history import HistoryCompaction
from runbus.messages.runs import CallEdit, RunEdit, RunFork
from runbus.messages.sessions import SessionDocument, SessionRecord, StoredCompaction
from runbus_gateway.run.pause import MAX_ADDED, InvalidEdit, PauseRecord, edited
from runbus_gateway.run_control import cut

SEAT = ToolSpec(
    name="choose_seat",
    description="Pick a seat.",
    parameters={
        "type": "object",
        "properties": {"flight_id": {"type": "string"}, "row": {"type": "integer"}},
        "required": ["flight_id"],
    },
)


def paused() -> PauseRecord:
    reply = ChatMessage(
        role="assistant",
        message_id="r-1:m0",
        contents=[
            TextContent(text="Picking seats."),
            FunctionCallContent(call_id="c-1", name="choose_seat", arguments={"flight_id": "QF1"}),
            FunctionCallContent(call_id="c-2", name="choose_seat", arguments={"flight_id": "QF2"}),
        ],
    )
    return PauseRecord(
        run_id="r-1", tenant="acme", user_id="alice", status="paused", reply=reply, tools=[SEAT]
    )


def test_an_edit_replaces_arguments_drops_calls_and_adds_notes_in_order() -> None:
    edit = RunEdit(
        run_id="r-1",
        replace=[CallEdit(call_id="c-1", arguments={"flight_id": "QF1", "row": 12})],
        drop=["c-2"],
        add=["front of the plane", "no middle seats"],
    )

    record = edited(paused(), edit)

    assert [(c.call_id, c.arguments) for c in record.calls] == [
        ("c-1", {"flight_id": "QF1", "row": 12})
    ]
    assert record.reply is not None
    assert record.reply.text == "Picking seats."
    assert [(m.message_id, m.text) for m in record.added] == [
        ("r-1:note1.0", "front of the plane"),
        ("r-1:note1.1", "no middle seats"),
    ]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (
            RunEdit(run_id="r-1", replace=[CallEdit(call_id="c-1", arguments={"row": 3})]),
            "call 'c-1': arguments for 'choose_seat': 'flight_id' is a required property",
        ),
        (
            RunEdit(
                run_id="r-1",
                replace=[CallEdit(call_id="c-1", arguments={"flight_id": "QF1", "row": "A"})],
            ),
            "call 'c-1': arguments for 'choose_seat': 'A' is not of type 'integer' at /row",
        ),
        (RunEdit(run_id="r-1", drop=["c-9"]), "call 'c-9': no such pending call"),
        (
            RunEdit(run_id="r-1", drop=["c-2"], add=["x"] * (MAX_ADDED + 1)),
            f"a pause adds at most {MAX_ADDED} messages",
        ),
    ],
)
def test_a_bad_edit_is_refused_whole(edit: RunEdit, problem: str) -> None:
    with pytest.raises(InvalidEdit) as refused:
        edited(paused(), edit)

    assert str(refused.value) == problem
    assert refused.value.code == "bad_request"


def test_edits_add_up_and_number_their_notes_on() -> None:
    once = edited(paused(), RunEdit(run_id="r-1", add=["first"]))
    twice = edited(once, RunEdit(run_id="r-1", add=["second"]))

    assert [m.message_id for m in twice.added] == ["r-1:note1.0", "r-1:note1.1"]


def message(message_id: str, role: str = "user") -> ChatMessage:
    return ChatMessage(role=role, message_id=message_id, contents=[TextContent(text=message_id)])  # type: ignore[arg-type]


def document() -> SessionDocument:
    stamp = datetime(2026, 12, 4, tzinfo=UTC)
    record = SessionRecord(
        session_id="trip",
        tenant="acme",
        owner="alice",
        agent="travel",
        created_at=stamp,
        updated_at=stamp,
        history_length=6,
        incarnation="inc-1",
        revision=7,
    )
    messages = [
        message("r-0:in0"),
        message("r-0:m0", "assistant"),
        message("r-1:in0"),
        message("r-1:m0", "assistant"),
        message("r-1:t0", "tool"),
        message("r-1:m1", "assistant"),
    ]
    early = StoredCompaction(
        after=2,
        compaction=HistoryCompaction(messages=[message("sum")], excluded_message_ids=["r-0:in0"]),
    )
    late = StoredCompaction(
        after=5,
        compaction=HistoryCompaction(messages=[message("sum")], excluded_message_ids=["r-1:t0"]),
    )
    return SessionDocument(record=record, messages=messages, compactions=[early, late])


@pytest.mark.parametrize(
    ("checkpoint", "kept"),
    [
        (0, ["r-0:in0", "r-0:m0"]),
        (2, ["r-0:in0", "r-0:m0", "r-1:in0", "r-1:m0"]),
        (None, ["r-0:in0", "r-0:m0", "r-1:in0", "r-1:m0", "r-1:t0", "r-1:m1"]),
    ],
)
def test_a_fork_keeps_the_history_before_the_run_and_its_first_messages(
    checkpoint: int | None, kept: list[str]
) -> None:
    forked, checkpoints, at = cut(
        document(), RunFork(run_id="r-1", session_id="trip-2", checkpoint=checkpoint)
    )

    assert [m.message_id for m in forked.messages] == kept
    assert at == len(kept) - 2
    assert [c.checkpoint for c in checkpoints] == [1, 2, 3, 4]
    assert forked.record.session_id == "trip-2"
    assert (forked.record.revision, forked.record.incarnation) == (0, "")
    assert forked.record.history_length == len(kept)
    # The compaction within the kept messages stays; the one past the cut does not.
    assert [c.after for c in forked.compactions] == ([2, 5] if checkpoint is None else [2])


def test_a_fork_past_the_runs_last_checkpoint_is_refused() -> None:
    with pytest.raises(BadRequest, match="has checkpoints 0 to 4, not 5"):
        cut(document(), RunFork(run_id="r-1", session_id="x", checkpoint=5))
