"""History service requests and replies (`runbus.history.*`)."""

from typing import Final

import msgspec

from ._base import Identifier, Message
from .chat import ChatMessage

REPAIR_SUFFIX: Final = ":repair"
"""Appended to an assistant message's id to name the synthetic tool message that history adds
on load for calls left without results (a crash, a cancel, a terminate)."""


class HistoryAppend(Message, frozen=True, tag="history.append"):
    session_id: Identifier
    """Session to append to; the tenant comes from the trusted headers."""
    messages: list[ChatMessage]
    """Messages new in this run; ones stamped `chat_history` are skipped."""
    release: bool = False
    """Last append of a run: also release the run's claim on the session."""
    history_length: int | None = None
    """With `release`: the session's message count after this run."""


class HistoryAppended(Message, frozen=True, tag="history.appended"):
    stored: int
    """Messages written now."""
    skipped: int
    """Messages not written: loaded from history already, or an id stored before."""


class HistoryLoad(Message, frozen=True, tag="history.load"):
    session_id: Identifier
    """Session to read; the tenant comes from the trusted headers."""
    last_turns: int | None = None
    """Only the last N turns (a turn starts at a user message); None: everything."""


class HistoryLoaded(Message, frozen=True, tag="history.loaded"):
    messages: list[ChatMessage]
    """The session's messages in order, stamped `source="chat_history"`."""


HistoryRequest = HistoryAppend | HistoryLoad
HistoryReply = HistoryAppended | HistoryLoaded

HISTORY_APPEND_DECODER = msgspec.json.Decoder(HistoryAppend)
HISTORY_APPENDED_DECODER = msgspec.json.Decoder(HistoryAppended)
HISTORY_LOAD_DECODER = msgspec.json.Decoder(HistoryLoad)
HISTORY_LOADED_DECODER = msgspec.json.Decoder(HistoryLoaded)
