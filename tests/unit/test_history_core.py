"""History rules: how loads are stamped (what an append stores: test_history_batches.py)."""

from datetime import UTC, datetime

from runbus.history_batches import messages_to_store
from runbus.messages import ChatMessage, Source, TextContent
from runbus.messages.history import HistoryCompaction, StoredBatch
from runbus.messages.sessions import SessionRecord
from runbus_history.core import (
    abandoned_runs,
    appendable,
    document_history,
    live_run,
    loaded,
    new_incarnation,
)


def message(message_id: str, text: str = "hi", source: Source = "external") -> ChatMessage:
    return ChatMessage(
        role="user", contents=[TextContent(text=text)], message_id=message_id, source=source
    )


def test_loaded_messages_keep_their_order_and_the_first_copy_of_each_id() -> None:
    batches = [
        StoredBatch(messages=[message("a", "first a"), message("b")]),
        StoredBatch(messages=[message("a", "second a"), message("c")]),
    ]

    history = loaded(batches)

    assert [(m.message_id, m.text) for m in history] == [
        ("a", "first a"),
        ("b", "hi"),
        ("c", "hi"),
    ]


def test_loaded_messages_are_stamped_as_chat_history() -> None:
    batches = [StoredBatch(messages=[message("a"), message("b", source="context_provider")])]

    assert {m.source for m in loaded(batches)} == {"chat_history"}


def test_loaded_history_is_never_stored_again() -> None:
    history = loaded([StoredBatch(messages=[message("a"), message("b")])])

    keep, skipped = messages_to_store([*history, message("c")])

    assert [m.message_id for m in keep] == ["c"]
    assert skipped == 2


def test_a_session_is_held_only_by_a_run_whose_claim_has_not_expired() -> None:
    stamp = datetime(2026, 12, 1, tzinfo=UTC)
    free = SessionRecord(
        session_id="s1", tenant="acme", owner="alice", agent="travel",
        created_at=stamp, updated_at=stamp,
    )  # fmt: skip
    held = SessionRecord(
        session_id="s1", tenant="acme", owner="alice", agent="travel",
        created_at=stamp, updated_at=stamp, active_run="r-1", claim_expires=100.0,
    )  # fmt: skip

    assert live_run(free, now=50.0) is None
    assert live_run(held, now=50.0) == "r-1"
    assert live_run(held, now=100.0) is None  # expired: stale, nobody holds it


def test_a_load_reads_only_what_was_stored_for_its_incarnation_exactly() -> None:
    batches = [
        StoredBatch(messages=[message("old")]),  # unstamped: left by a session made before
        StoredBatch(messages=[message("a")], incarnation="one"),
        StoredBatch(messages=[message("late")], incarnation="zero"),
        StoredBatch(messages=[message("b")], incarnation="one"),
    ]

    assert [m.message_id for m in loaded(batches, incarnation="one")] == ["a", "b"]
    # A session made before incarnations were kept has none, and reads only unstamped ones.
    assert [m.message_id for m in loaded(batches, incarnation="")] == ["old"]


def test_only_a_run_of_the_sessions_current_incarnation_may_append() -> None:
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    record = SessionRecord(
        session_id="s1",
        tenant="acme",
        owner="alice",
        agent="travel",
        created_at=stamp,
        updated_at=stamp,
        incarnation="one",
    )

    assert appendable(record, "one")
    assert appendable(record, "")  # a caller that does not know it: the session as it is
    assert not appendable(record, "zero")


def test_a_session_made_again_gets_an_incarnation_of_its_own() -> None:
    made = {new_incarnation() for _ in range(100)}

    assert len(made) == 100
    assert "" not in made


def test_an_export_holds_only_its_incarnations_messages_and_compactions_unstamped() -> None:
    batches = [
        (1, StoredBatch(messages=[message("a")], incarnation="one")),
        (3, StoredBatch(messages=[message("late")], incarnation="zero")),
        (5, StoredBatch(messages=[message("b")], incarnation="one")),
    ]
    compactions = [
        (2, HistoryCompaction(messages=[message("sum")], incarnation="one")),
        (4, HistoryCompaction(messages=[message("stale")], incarnation="zero")),
    ]

    messages, placed = document_history(batches, compactions, "one")

    assert [m.message_id for m in messages] == ["a", "b"]
    assert [(c.after, c.compaction.messages[0].message_id) for c in placed] == [(1, "sum")]
    assert placed[0].compaction.incarnation == ""


def test_an_abandon_marker_of_a_run_that_closed_its_history_hides_none_of_it() -> None:
    # Two attempts of run r2 alive at once: one cut off fails it for good, the other finishes
    # it — in either order, the finished run's transcript stays in the session.
    closed = StoredBatch(messages=[message("r2:in0"), message("r2:m0")], closed_run="r2")
    marker = StoredBatch(messages=[], abandoned_run="r2")
    earlier = StoredBatch(messages=[message("r1:in0")])
    for batches in ([earlier, closed, marker], [earlier, marker, closed]):
        assert [m.message_id for m in loaded(batches)] == ["r1:in0", "r2:in0", "r2:m0"]
        assert abandoned_runs(batches) == []


def test_an_abandon_marker_hides_a_run_that_never_closed_its_history() -> None:
    batches = [
        StoredBatch(messages=[message("r1:in0")], closed_run="r1"),
        StoredBatch(messages=[message("r2:in0")]),
        StoredBatch(messages=[], abandoned_run="r2"),
    ]

    assert [m.message_id for m in loaded(batches)] == ["r1:in0"]
    assert abandoned_runs(batches) == ["r2"]
    assert [m.message_id for m in loaded(batches, abandoned=True)] == ["r1:in0", "r2:in0"]
