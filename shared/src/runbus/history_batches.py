"""What one append stores in the history stream, written the same way by the history service
and by the gateway's direct checkpoints: which messages, and the `Nats-Msg-Id` that makes a
retried append of them stored once."""

import hashlib

from .errors import BadRequest
from .messages import ChatMessage


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
