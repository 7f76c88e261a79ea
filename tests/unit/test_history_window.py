"""The window a long session's load keeps, and how a long session travels in pieces (import
chunks, document parts), without a bus."""

from datetime import UTC, datetime

import msgspec

from runbus.commands.sessions import document_parts
from runbus.messages import ChatMessage, TextContent
from runbus.messages.history import HistoryCompaction
from runbus.messages.sessions import SessionDocument, SessionRecord, StoredCompaction
from runbus_history import core


def turn(n: int, size: int = 100) -> list[ChatMessage]:
    return [
        ChatMessage(role="user", contents=[TextContent(text="q" * size)], message_id=f"u{n}"),
        ChatMessage(role="assistant", contents=[TextContent(text="a" * size)], message_id=f"a{n}"),
    ]


def sizes_of(messages: list[ChatMessage]) -> list[int]:
    return [len(msgspec.json.encode(m)) for m in messages]


def test_the_window_keeps_the_last_whole_turns_that_fit() -> None:
    messages = [m for n in range(10) for m in turn(n)]
    sizes = sizes_of(messages)
    per_turn = sizes[0] + sizes[1]

    start = core.window_start(messages, sizes, 3 * per_turn + 1)

    assert start == 14
    assert messages[start].role == "user"
    assert sum(sizes[start:]) <= 3 * per_turn + 1


def test_the_window_keeps_the_last_turn_even_when_it_alone_is_larger() -> None:
    messages = [*turn(0), *turn(1, size=5000)]
    assert core.window_start(messages, sizes_of(messages), 1000) == 2


def test_a_history_that_fits_or_has_no_turn_to_leave_out_is_kept_whole() -> None:
    messages = [m for n in range(3) for m in turn(n)]
    assert core.window_start(messages, sizes_of(messages), 10**6) == 0
    replies = [m for m in turn(0) if m.role == "assistant"] * 3
    assert core.window_start(replies, sizes_of(replies), 1) == 0


def test_import_chunks_hold_at_most_the_budget_and_keep_the_order() -> None:
    messages = [m for n in range(20) for m in turn(n)]
    budget = 3 * sizes_of(messages)[0]

    chunks = core.chunks_of_size(messages, budget)

    assert [m for chunk in chunks for m in chunk] == messages
    assert all(sum(sizes_of(chunk)) <= budget for chunk in chunks)
    assert core.chunks_of_size([*turn(0, size=10_000)], 10) == [[m] for m in turn(0, size=10_000)]


def test_document_parts_keep_every_message_and_place_each_compaction_after_the_same_ones() -> None:
    messages = [m for n in range(30) for m in turn(n)]
    now = datetime.now(UTC)
    record = SessionRecord(
        session_id="s", tenant="t", owner="u", agent="a", created_at=now, updated_at=now
    )
    compactions = [
        StoredCompaction(after=after, compaction=HistoryCompaction(messages=messages[:1]))
        for after in (0, 7, 20, 41, 60)
    ]
    document = SessionDocument(record=record, messages=messages, compactions=compactions)

    parts = document_parts(document, 5 * sizes_of(messages)[0])

    assert len(parts) > 3
    assert [m for part in parts for m in part.messages] == messages
    placed: list[int] = []
    before = 0
    for part in parts:
        placed.extend(before + c.after for c in part.compactions)
        assert all(0 <= c.after <= len(part.messages) for c in part.compactions)
        before += len(part.messages)
    assert placed == [0, 7, 20, 41, 60]
