"""History rules: how loads are stamped (what an append stores: test_history_batches.py)."""

from runbus.history_batches import messages_to_store
from runbus.messages import ChatMessage, Source, TextContent
from runbus.messages.history import StoredBatch
from runbus_history.core import loaded


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
