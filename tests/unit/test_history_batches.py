"""What one append stores in the history stream — the same for the history service and the
gateway's direct checkpoints: which messages, their encoding, the batch's de-duplication id."""

from datetime import UTC, datetime

import pytest

from runbus import subjects
from runbus.history_batches import MissingMessageId, batch_id, messages_to_store
from runbus.messages import ChatMessage, Source, TextContent
from runbus.messages.history import BATCH_DECODER, BATCH_ENCODER, StoredBatch


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


def test_the_batch_id_is_the_digest_stored_batches_always_had() -> None:
    # Batches stored before the gateway wrote any (and by older replicas) are found again by
    # this id: a retry or a resumed run across an upgrade must still be stored once.
    subject = subjects.history_log("acme", "s1")

    assert subject == "runbus.hist.acme.s1"
    assert batch_id(subject, [message("r-1:in0"), message("r-1:m0")]) == (
        "30a2206a2ca52213769179428cc0c557dfef09c9d9d6047eded57a09b06da2f2"
    )


def test_a_stored_batch_decodes_to_the_messages_it_was_made_of() -> None:
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    messages = [
        ChatMessage(
            role="user",
            contents=[TextContent(text="Weather?")],
            message_id="r-1:in0",
            created_at=stamp,
        ),
        message("r-1:m0", "Sunny.", source="compaction"),
    ]

    data = BATCH_ENCODER.encode(StoredBatch(messages=messages))

    assert BATCH_DECODER.decode(data).messages == messages


def test_a_batch_as_stored_by_earlier_versions_still_decodes() -> None:
    data = (
        b'{"messages":[{"role":"user","contents":[{"type":"text","text":"Weather?"}],'
        b'"message_id":"r-1:in0","created_at":null,"source":"external"}]}'
    )

    (only,) = BATCH_DECODER.decode(data).messages

    assert (only.role, only.text, only.message_id) == ("user", "Weather?", "r-1:in0")
