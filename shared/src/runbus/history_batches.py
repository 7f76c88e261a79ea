"""What one append stores in the history stream, written the same way by the history service
and by the gateway's direct checkpoints: which messages and persisted compaction, and the
`Nats-Msg-Id` that makes a retried append of them stored once."""

import hashlib

import msgspec

from .errors import BadRequest
from .messages import ChatMessage
from .messages.history import HistoryCompaction


class MissingMessageId(BadRequest):
    def __init__(self, index: int) -> None:
        super().__init__(f"message {index} has no message_id; history stores each id once")
        self.index = index


def messages_to_store(messages: list[ChatMessage]) -> tuple[list[ChatMessage], int]:
    """The messages an append writes, and how many it skips.

    A message stamped `chat_history` was loaded from history and is never stored again.
    Whether `context_provider` messages (memories, the todo list) are kept is the agent's
    choice, made by the gateway: it sends them only when the agent opts in.
    """
    keep: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if not message.message_id:
            raise MissingMessageId(index)
        if message.source != "chat_history":
            keep.append(message)
    return keep, len(messages) - len(keep)


def batch_id(subject: str, messages: list[ChatMessage]) -> str:
    """`Nats-Msg-Id` of one stored batch: a retried append of the same message ids to the same
    session subject has the same id, so the stream keeps it once (whoever writes it)."""
    digest = hashlib.sha256(subject.encode())
    for message in messages:
        digest.update(b"\0" + message.message_id.encode())
    return digest.hexdigest()


def compaction_to_store(compaction: HistoryCompaction, incarnation: str) -> HistoryCompaction:
    """The compaction as stored for the session incarnation `incarnation`: every message has
    an id (later appends are matched against them), none of them is also excluded."""
    excluded = set(compaction.excluded_message_ids)
    for index, message in enumerate(compaction.messages):
        if not message.message_id:
            raise MissingMessageId(index)
    return msgspec.structs.replace(
        compaction,
        messages=[m for m in compaction.messages if m.message_id not in excluded],
        incarnation=incarnation,
    )


def compaction_id(session_key: str, compaction: HistoryCompaction) -> str:
    """`Nats-Msg-Id` of one persisted compaction: a retried append stores it once (whoever
    writes it)."""
    digest = hashlib.sha256(b"compaction\0" + session_key.encode())
    for message in compaction.messages:
        digest.update(b"\0" + message.message_id.encode())
    for excluded in compaction.excluded_message_ids:
        digest.update(b"\1" + excluded.encode())
    return digest.hexdigest()


def closing_id(subject: str, run_id: str) -> str:
    """`Nats-Msg-Id` of a finished run's closing append: stored once per run, so of two
    attempts of one run that both finished (a partition), only the first's transcript is
    kept — the one whose final event the events stream kept too."""
    return hashlib.sha256(b"closing\0" + subject.encode() + b"\0" + run_id.encode()).hexdigest()


def abandon_id(subject: str, run_id: str) -> str:
    """`Nats-Msg-Id` of the marker that a run failed for good: stored once per run."""
    return hashlib.sha256(b"abandon\0" + subject.encode() + b"\0" + run_id.encode()).hexdigest()
