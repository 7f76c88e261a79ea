"""Session records and session operations (`runbus.sessions.*`), owned by the history service.

Every operation is checked against the caller's tenant and user from trusted headers; a session
that belongs to someone else answers exactly like one that does not exist (`not_found`).
"""

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from ._base import Identifier, Message, Record
from .chat import ChatMessage
from .history import HistoryCompaction

ConcurrencyPolicy = Literal["reject", "enqueue", "interrupt"]
"""What a second run on a busy session does: fail with `session_busy` (default), wait for the
first to finish, or cancel the first and take over."""

StateKey = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]{1,64}\Z")]


class SessionRecord(Record, frozen=True):
    session_id: str
    """The session."""
    tenant: str
    """Tenant it belongs to."""
    owner: str
    """user_id of the owner: the only user who can read or write it."""
    agent: str
    """Agent that created it."""
    created_at: datetime
    """When it was created (UTC)."""
    updated_at: datetime
    """Last run or state change (UTC)."""
    state: dict[str, Any] = {}
    """The state bag: JSON values keyed by provider (`todos`, `selected_flight`, …)."""
    history_length: int = 0
    """Messages in its history after the last finished run."""
    active_run: str | None = None
    """Run holding the session now (the concurrency claim), if any."""
    claim_expires: float | None = None
    """Epoch seconds after which `active_run`'s claim is stale (its deadline)."""
    revision: int = 0
    """Store revision this record was read at; pass it back for compare-and-set."""
    incarnation: str = ""
    """Which making of this session id it is: a new random id each time the session is
    created or imported. What is stored for it carries the same id, so a write by a run that
    opened an earlier session of this id (deleted since) is never read as this one's. Empty
    for a session made before incarnations were kept."""


class SessionOpen(Message, frozen=True, tag="sessions.open"):
    session_id: Identifier
    """Session to open; created for the caller if it does not exist."""
    policy: ConcurrencyPolicy = "reject"
    """What to do if another run holds the session."""
    last_turns: int | None = None
    """Load only the last N turns of history (None: all)."""


class SessionOpened(Message, frozen=True, tag="sessions.opened"):
    record: SessionRecord
    """The record, now claimed by the caller's run."""
    messages: list[ChatMessage]
    """Its history, repaired and stamped `chat_history`."""
    created: bool = False
    """True if this call created the session."""
    interrupted_run: str | None = None
    """Run that was cancelled to make room (policy `interrupt`)."""
    history_end: int | None = None
    """Stream sequence of the session's last stored batch when it was read (0: none stored);
    None when unknown. A run's checkpoints store directly after it (see `HistoryAppended`)."""


class SessionGet(Message, frozen=True, tag="sessions.get"):
    session_id: Identifier
    """Session to read."""


class SessionInfo(Message, frozen=True, tag="sessions.info"):
    record: SessionRecord
    """The record."""


class SessionList(Message, frozen=True, tag="sessions.list"):
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    """At most this many, newest first."""


class SessionListed(Message, frozen=True, tag="sessions.listed"):
    records: list[SessionRecord]
    """The caller's sessions, newest first."""
    more: bool = False
    """Newer-first records were left out past these: the reply would not fit on the bus
    (large state bags); ask with a smaller `limit`."""


class SessionStateUpdate(Message, frozen=True, tag="sessions.state.update"):
    session_id: Identifier
    """Session whose state bag changes."""
    key: StateKey
    """Provider key in the state bag."""
    value: Any = None
    """New JSON value; None removes the key."""
    expected_revision: int | None = None
    """Compare-and-set: fail with `conflict` unless the record is still at this revision."""


class StoredCompaction(Record, frozen=True):
    """A persisted compaction in a session document, placed among the stored messages."""

    after: Annotated[int, msgspec.Meta(ge=0)]
    """How many of the document's `messages` were stored before it."""
    compaction: HistoryCompaction
    """What it made of the history up to there."""


class SessionDocument(Record, frozen=True):
    """A whole session as one JSON document: what export writes and import reads."""

    record: SessionRecord
    """The session record (revision 0)."""
    messages: list[ChatMessage]
    """Its history as stored, in order: every original, compacted or not."""
    compactions: list[StoredCompaction] = []
    """Its persisted compactions, oldest first; a load starts from the last one."""
    abandoned_runs: list[str] = []
    """Runs that failed for good: their messages are in `messages` (audit), loads leave them
    out (`HistoryAppend.abandon`)."""
    format: Literal["runbus.session.v1"] = "runbus.session.v1"
    """Document format; a breaking change gets a new one."""


class SessionExport(Message, frozen=True, tag="sessions.export"):
    session_id: Identifier
    """Session to export."""
    after: int | None = None
    """Export one page: what is stored after this stream position (0: from the start; then
    each reply's `next_after`). None: the whole session in one reply, refused with
    `message_too_large` when it does not fit on the bus."""


class SessionExported(Message, frozen=True, tag="sessions.exported"):
    document: SessionDocument
    """Record and history (of a page: its messages, and its compactions placed among them)."""
    next_after: int | None = None
    """A page that did not reach the end: pass this as `after` for the next page."""


class SessionImport(Message, frozen=True, tag="sessions.import"):
    document: SessionDocument
    """A document made by export; its tenant and owner must be the caller's. In parts: each
    part's messages follow the previous part's, its compactions placed among its own."""
    more: bool = False
    """More parts follow: the session stays claimed by the import (runs get `session_busy`)
    until the part without `more`."""
    part_of: str = ""
    """A later part: the incarnation of the session the first part made (its reply's
    `record.incarnation`). Empty: the first (or only) part, which creates the session."""


class SessionDelete(Message, frozen=True, tag="sessions.delete"):
    session_id: Identifier
    """Session to delete: history, record and its memories."""


class SessionDeleted(Message, frozen=True, tag="sessions.deleted"):
    session_id: str
    """The deleted session."""
    memories_forgotten: bool = False
    """True if the memory service confirmed forgetting the session's memories."""
