"""History service requests and replies (`runbus.history.*`), and the batch of messages one
append stores in the history stream (written by the history service and, for a run's
checkpoints, by the gateway directly; its rules: `runbus.history_batches`)."""

from typing import Final

import msgspec

from ._base import Identifier, Message, Record
from .chat import ChatMessage

REPAIR_SUFFIX: Final = ":repair"
"""Appended to an assistant message's id to name the synthetic tool message that history adds
on load for calls left without results (a crash, a cancel, a terminate)."""


class HistoryCompaction(Record, frozen=True):
    """A persisted compaction: from here on, the session's history is `messages` followed by
    whatever is appended later. The stored originals it replaces stay stored for audit and
    export; loads no longer read them."""

    messages: list[ChatMessage]
    """The compacted history as the model saw it (summaries and collapsed tool calls stamped
    `compaction`, kept messages as they were); no context-provider messages."""
    excluded_message_ids: list[str] = []
    """Stored messages this compaction replaced; skipped even if an append after it repeats
    them (a retried checkpoint)."""
    incarnation: str = ""
    """Set by history as it stores the compaction: the session incarnation it belongs to
    (`SessionRecord.incarnation`)."""


class HistoryAppend(Message, frozen=True, tag="history.append"):
    session_id: Identifier
    """Session to append to; the tenant comes from the trusted headers."""
    messages: list[ChatMessage]
    """Messages new in this run; ones stamped `chat_history` are skipped."""
    release: bool = False
    """Last append of a run: also release the run's claim on the session."""
    history_length: int | None = None
    """With `release`: the session's message count after this run."""
    compaction: HistoryCompaction | None = None
    """A compaction to persist, stored before `messages` (it covers the run's messages up to
    when it was made; `messages` may hold later ones): later loads start from it."""
    incarnation: str = ""
    """The session's incarnation as the run opened it (`SessionOpened.record`): an append
    for a session deleted and made again since is refused as `not_found`. Empty: whichever
    the session is now (a caller that does not know it)."""
    abandon: bool = False
    """The calling run (the `run_id` of the headers) failed for good: what it stored (its
    input, its replies so far) stays stored for audit and export, but no later load returns
    it, so the next run's prompt does not carry a failed run's leftovers."""
    closes: bool = False
    """With `release`: the run finished (its answer is next), so its messages are marked
    closed (`StoredBatch.closed_run`): an abandon marker of the same run, left by an attempt
    of it cut off meanwhile, never hides them."""


class HistoryAppended(Message, frozen=True, tag="history.appended"):
    stored: int
    """Messages written now."""
    skipped: int
    """Messages not written: loaded from history already, or an id stored before."""
    history_end: int | None = None
    """Stream sequence of the batch written now: where the session's stored messages end, as
    far as this append knows. None when it wrote none (nothing new, or a retry)."""


class HistoryLoad(Message, frozen=True, tag="history.load"):
    session_id: Identifier
    """Session to read; the tenant comes from the trusted headers."""
    last_turns: int | None = None
    """Only the last N turns (a turn starts at a user message); None: everything."""
    originals: bool = False
    """Every message ever stored, persisted compactions ignored (audit); default: the history
    from the latest persisted compaction on."""
    after: int | None = None
    """Read one page: the stored history after this stream position (0: from the start; then
    each reply's `next_after`), as stored (no repair, no `last_turns`). None: the whole history
    in one reply, refused with `message_too_large` when it does not fit on the bus."""


class HistoryLoaded(Message, frozen=True, tag="history.loaded"):
    messages: list[ChatMessage]
    """The session's messages in order, stamped `source="chat_history"`."""
    compacted: bool = False
    """True if a persisted compaction stands in for older stored messages."""
    next_after: int | None = None
    """A page read (`HistoryLoad.after`) that did not reach the end: pass this as `after` for
    the next page. None: nothing is stored after this reply."""


HistoryRequest = HistoryAppend | HistoryLoad
HistoryReply = HistoryAppended | HistoryLoaded


class StoredBatch(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One message of the history stream: the messages of one append, in order (a storage
    format, not a request)."""

    messages: list[ChatMessage]
    incarnation: str = ""
    """The session incarnation it was stored for (`SessionRecord.incarnation`); a load of
    another incarnation skips it. Empty: stored before incarnations were kept, read by any."""
    abandoned_run: str = ""
    """A marker (no messages) stored when this run failed for good: a load that reads it
    leaves out every message of that run (ids `<run_id>:…`), wherever it was stored."""
    closed_run: str = ""
    """The run whose closing append (its last messages, with the session's release) this is:
    a run that got this far made its whole transcript, so an abandon marker of the same run
    (left by an attempt of it cut off meanwhile, `abandoned_run`) never hides its messages."""


BATCH_ENCODER = msgspec.json.Encoder()
BATCH_DECODER = msgspec.json.Decoder(StoredBatch)
