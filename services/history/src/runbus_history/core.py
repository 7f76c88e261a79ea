"""History rules without a bus: what to store, how loaded messages are stamped."""

import hashlib

import msgspec

from runbus.messages import ChatMessage

from .errors import MissingMessageId


class StoredBatch(msgspec.Struct, frozen=True, kw_only=True):
    """One stream message: the messages of one append, in order (storage format, not wire)."""

    messages: list[ChatMessage]


BATCH_ENCODER = msgspec.json.Encoder()
BATCH_DECODER = msgspec.json.Decoder(StoredBatch)


def messages_to_store(messages: list[ChatMessage]) -> tuple[list[ChatMessage], int]:
    """The messages an append writes, and how many it skips.

    A message stamped `chat_history` was loaded from here and is never stored again.
    """
    keep: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if not message.message_id:
            raise MissingMessageId(index)
        if message.source != "chat_history":
            keep.append(message)
    return keep, len(messages) - len(keep)


def batch_id(session_key: str, messages: list[ChatMessage]) -> str:
    """De-duplication id of one append: a retried append of the same messages has the same id."""
    digest = hashlib.sha256(session_key.encode())
    for message in messages:
        digest.update(b"\0" + message.message_id.encode())
    return digest.hexdigest()


def loaded(batches: list[StoredBatch]) -> list[ChatMessage]:
    """Messages of the stored batches in order, each id once, stamped `chat_history`."""
    seen: set[str] = set()
    out: list[ChatMessage] = []
    for batch in batches:
        for message in batch.messages:
            if message.message_id in seen:
                continue
            seen.add(message.message_id)
            out.append(msgspec.structs.replace(message, source="chat_history"))
    return out
