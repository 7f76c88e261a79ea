"""History service requests and replies (`runbus.history.*`)."""

import msgspec

from ._base import Identifier, Message
from .chat import ChatMessage


class HistoryAppend(Message, frozen=True, tag="history.append"):
    session_id: Identifier
    """Session to append to; the tenant comes from the trusted headers."""
    messages: list[ChatMessage]
    """Messages new in this run; ones stamped `chat_history` are skipped."""


class HistoryAppended(Message, frozen=True, tag="history.appended"):
    stored: int
    """Messages written now."""
    skipped: int
    """Messages not written: loaded from history already, or an id stored before."""


class HistoryLoad(Message, frozen=True, tag="history.load"):
    session_id: Identifier
    """Session to read; the tenant comes from the trusted headers."""


class HistoryLoaded(Message, frozen=True, tag="history.loaded"):
    messages: list[ChatMessage]
    """The session's messages in order, stamped `source="chat_history"`."""


HistoryRequest = HistoryAppend | HistoryLoad
HistoryReply = HistoryAppended | HistoryLoaded

HISTORY_APPEND_DECODER = msgspec.json.Decoder(HistoryAppend)
HISTORY_APPENDED_DECODER = msgspec.json.Decoder(HistoryAppended)
HISTORY_LOAD_DECODER = msgspec.json.Decoder(HistoryLoad)
HISTORY_LOADED_DECODER = msgspec.json.Decoder(HistoryLoaded)
