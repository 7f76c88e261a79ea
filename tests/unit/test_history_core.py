"""History rules: what an append stores, its de-duplication id, and how loads are stamped."""

import pytest

from runbus.messages import ChatMessage, Source, TextContent
from runbus_history.core import StoredBatch, batch_id, loaded, messages_to_store
from runbus_history.errors import MissingMessageId


def message(message_id: str, text: str = "hi", source: Source = "external") -> ChatMessage:
    return ChatMessage(
        role="user", contents=[TextContent(text=text)], message_id=message_id, source=source
    )


def test_an_append_stores_new_messages_in_order_and_skips_loaded_ones() -> None:
    batch = [
        message("old-1", source="chat_history"),
        message("r-1-in-0"),
        message("memory", source="context_provider"),
        message("old-2", source="chat_history"),
        message("r-1-m0", source="compaction"),
    ]

    keep, skipped = messages_to_store(batch)

    assert [m.message_id for m in keep] == ["r-1-in-0", "memory", "r-1-m0"]
    assert skipped == 2


def test_a_message_without_an_id_is_refused_naming_its_position() -> None:
    with pytest.raises(MissingMessageId) as raised:
        messages_to_store([message("a"), message("b"), message("")])

    assert raised.value.index == 2
    assert raised.value.code == "bad_request"
    assert "message 2" in raised.value.message


def test_a_retried_append_of_the_same_ids_has_the_same_batch_id() -> None:
    first = batch_id("acme.s1", [message("r-1-in-0", "hello"), message("r-1-m0")])
    retry = batch_id("acme.s1", [message("r-1-in-0", "hello again"), message("r-1-m0")])

    assert first == retry


@pytest.mark.parametrize(
    ("session", "ids"),
    [
        ("acme.s1", ["r-1-in-0"]),
        ("acme.s1", ["r-1-m0", "r-1-in-0"]),
        ("acme.s1", ["r-1-in-0r-1-m0"]),
        ("acme.s2", ["r-1-in-0", "r-1-m0"]),
        ("globex.s1", ["r-1-in-0", "r-1-m0"]),
    ],
)
def test_appends_of_other_ids_or_another_session_have_other_batch_ids(
    session: str, ids: list[str]
) -> None:
    reference = batch_id("acme.s1", [message("r-1-in-0"), message("r-1-m0")])

    assert batch_id(session, [message(i) for i in ids]) != reference


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
