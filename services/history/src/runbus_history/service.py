"""The history service: thin handlers over `core` (rules), `store` (the history stream) and
`records` (session records in KV)."""

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Final, NamedTuple, Self

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import ops, subjects
from runbus.errors import RunbusError, Unavailable
from runbus.headers import RunContext
from runbus.history_batches import (
    abandon_id,
    batch_id,
    closing_id,
    compaction_id,
    compaction_to_store,
    messages_to_store,
)
from runbus.messages import (
    ChatMessage,
    HistoryAppend,
    HistoryAppended,
    HistoryLoad,
    HistoryLoaded,
    is_identifier,
)
from runbus.messages.history import (
    BATCH_DECODER,
    BATCH_ENCODER,
    HistoryCompaction,
    StoredBatch,
)
from runbus.messages.memory import MemoryForget
from runbus.messages.sessions import (
    SessionDelete,
    SessionDeleted,
    SessionDocument,
    SessionExport,
    SessionExported,
    SessionGet,
    SessionImport,
    SessionInfo,
    SessionList,
    SessionListed,
    SessionOpen,
    SessionOpened,
    SessionRecord,
    SessionStateUpdate,
)
from runbus.owners import Owner
from runbus.service import DEFAULT_OPTIONS, Endpoint, Service, ServiceOptions
from runbus.settings import Settings

from . import core, store
from .errors import (
    ForeignDocument,
    HistoryTooLarge,
    MissingIdentity,
    RevisionConflict,
    SessionExists,
    SessionNotFound,
)
from .records import SessionRecords, StaleRevision

CAS_ATTEMPTS: Final = 20
IMPORT_CHUNK: Final = 100
WINDOW_BYTES: Final = 256 * 1024
"""Default high-water mark of the history a run loads: once what a load reads is larger (and
never above a quarter of the bus's max payload), history keeps the last whole turns that fit
in half of it, and stores that as a persisted compaction, so later loads read only that."""
WINDOW_BATCHES: Final = 16
"""A load past half the window that read more batches than this is windowed too: a load reads
one compaction and a few batches rather than many (each stored message costs a load more than
its bytes do), so what a run loads stays between half the window and a little more."""
REPLY_HEADROOM: Final = 8 * 1024
"""Bytes of a reply's limit kept for what is not messages (record, framing, headers)."""
EXCLUDED_IDS: Final = 1000
"""Ids a window compaction lists as excluded, newest first (a retried append repeats recent
ones; the stored originals stay either way)."""
SESSION_IMPORT_CLAIM: Final = 600.0
"""Seconds an import in parts holds the session between two parts before a run may take it."""


class Stored(NamedTuple):
    """What a read found stored under a session id, before it is matched to the record's
    incarnation (the read starts before the record is known)."""

    batches: list[StoredBatch]
    compaction: HistoryCompaction | None
    """The latest persisted compaction the read started from (None: from the first batch)."""
    end: int | None
    """Stream sequence of the last stored batch (0: none); None when the read did not see it."""
    size: int = 0
    """Bytes read (the compaction's and the batches' stored bodies)."""


class Page(NamedTuple):
    """Stored messages of one subject, in order, as many as a page holds."""

    items: list[tuple[int, bytes]]
    """Stream sequence and stored body of each."""
    size: int
    """Bytes of the bodies."""
    more: int | None
    """The sequence of the last one read when more are stored (where the next page starts
    after); None when the page reached the end."""


class History(NamedTuple):
    """A session's history as read."""

    messages: list[ChatMessage]
    compacted: bool
    """A persisted compaction stands in for older stored messages."""
    end: int | None
    """Stream sequence of the last stored batch (0: none); None when the read did not see it."""


def caller(ctx: RunContext) -> Owner:
    """The owner the trusted headers name; `MissingIdentity` unless both are identifiers."""
    owner = Owner.of(ctx)
    if not owner.identified:
        raise MissingIdentity()
    return owner


class HistoryService(Service):
    name = "history"
    description = "Chat history and session records, on JetStream"

    def __init__(
        self,
        nc: NATS,
        *,
        replicas: int = 1,
        max_age: float = 0.0,
        max_appends_per_session: int = 0,
        window_bytes: int = 0,
        options: ServiceOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(nc, options=options)
        self.replicas = replicas
        self.max_age = max_age
        self.max_appends_per_session = max_appends_per_session
        self.window_bytes = window_bytes
        """High-water mark of a loaded history (see WINDOW_BYTES); 0: the default."""
        self._records: SessionRecords | None = None

    @property
    def reply_limit(self) -> int:
        """Bytes of messages one reply may carry: the bus's max payload, less headroom."""
        return self.nc.max_payload - REPLY_HEADROOM

    @property
    def window(self) -> int:
        """The loaded history's high-water mark on this bus."""
        return self.window_bytes or min(WINDOW_BYTES, self.nc.max_payload // 4)

    @property
    def page_bytes(self) -> int:
        """Stored bytes one page reads: half a reply (messages grow a little as loaded)."""
        return self.reply_limit // 2

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(
            nc,
            replicas=settings.stream_replicas,
            max_age=settings.history_max_age,
            max_appends_per_session=settings.history_max_appends,
            options=ServiceOptions(
                tracer_provider=tracer_provider, request_timeout=settings.request_timeout
            ),
        )

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint.for_op(ops.HISTORY_APPEND, self.on_append),
            Endpoint.for_op(ops.HISTORY_LOAD, self.on_load),
            Endpoint.for_op(ops.SESSIONS_OPEN, self.on_open),
            Endpoint.for_op(ops.SESSIONS_GET, self.on_get),
            Endpoint.for_op(ops.SESSIONS_LIST, self.on_list),
            Endpoint.for_op(ops.SESSIONS_STATE_UPDATE, self.on_state_update),
            Endpoint.for_op(ops.SESSIONS_EXPORT, self.on_export),
            Endpoint.for_op(ops.SESSIONS_IMPORT, self.on_import),
            Endpoint.for_op(ops.SESSIONS_DELETE, self.on_delete),
        ]

    async def on_start(self) -> None:
        await store.ensure_stream(
            self.nc,
            replicas=self.replicas,
            max_age=self.max_age,
            max_per_session=self.max_appends_per_session,
        )
        self._records = await SessionRecords.open(self.nc, replicas=self.replicas)

    async def on_stop(self) -> None:
        if self._records is not None:
            await self._records.close()

    @property
    def records(self) -> SessionRecords:
        assert self._records is not None, "start() opens the records bucket"
        return self._records

    # -- history -------------------------------------------------------------------------

    async def on_load(self, ctx: RunContext, request: HistoryLoad) -> HistoryLoaded:
        who = caller(ctx)
        if request.originals or request.after is not None:
            return await self._load_pages(ctx, who, request)
        reading = asyncio.ensure_future(
            self._read(ctx, who, request.session_id, originals=request.originals)
        )
        try:
            record = core.owned(
                await self.records.recent(who.tenant, request.session_id),
                who.user_id,
                request.session_id,
            )
        except BaseException:
            reading.cancel()
            raise
        history = await self._history(ctx, who, await reading, record)
        return HistoryLoaded(
            messages=core.last_turns(core.repair(history.messages), request.last_turns),
            compacted=history.compacted,
        )

    async def on_append(self, ctx: RunContext, request: HistoryAppend) -> HistoryAppended:
        who = caller(ctx)
        # The record as last heard of is enough: it is only checked for the owner and its
        # incarnation and, on release, changed by compare-and-set, which re-reads if it moved
        # on. What a record heard of late lets through is still stamped with the run's
        # incarnation, which loads of a newer one skip.
        record = core.owned(
            await self.records.recent(who.tenant, request.session_id),
            who.user_id,
            request.session_id,
        )
        if not core.appendable(record, request.incarnation):
            # Maybe only this replica's copy is older than the run's session: read it again.
            record = core.owned(
                await self.records.get(who.tenant, request.session_id),
                who.user_id,
                request.session_id,
            )
            if not core.appendable(record, request.incarnation):
                raise SessionNotFound(request.session_id)
        incarnation = request.incarnation or record.incarnation
        to_store, skipped = messages_to_store(request.messages)
        if request.compaction is not None:
            # Before the messages: a load takes the compaction, then what was stored after it.
            # It covers every message the run had when it was made, stored earlier or in this
            # append (found in it again, or excluded by it); what this append adds beyond it
            # (the reply the model gave after it) must be read after it.
            compaction = compaction_to_store(request.compaction, incarnation)
            markers = subjects.history_compactions(who.tenant, request.session_id)
            await store.append(
                self.nc,
                markers,
                BATCH_ENCODER.encode(compaction),
                compaction_id(markers, compaction),
            )
        stored, end = 0, None
        if to_store:
            subject = subjects.history_log(who.tenant, request.session_id)
            # The closing append of a run that finished marks the run closed.
            closed = ctx.run_id if request.closes and not request.abandon else ""
            batch = StoredBatch(messages=to_store, incarnation=incarnation, closed_run=closed)
            data = BATCH_ENCODER.encode(batch)
            msg_id = closing_id(subject, closed) if closed else batch_id(subject, to_store)
            end = await store.append(self.nc, subject, data, msg_id)
            stored, skipped = (len(to_store), skipped) if end else (0, len(request.messages))
        if request.abandon and ctx.run_id:
            subject = subjects.history_log(who.tenant, request.session_id)
            await self._abandon(subject, ctx.run_id, incarnation)
        if request.release:
            await self._update(
                record,
                lambda r: core.released(r, ctx.run_id, request.history_length, datetime.now(UTC)),
            )
        return HistoryAppended(stored=stored, skipped=skipped, history_end=end)

    # -- sessions ------------------------------------------------------------------------

    async def on_open(self, ctx: RunContext, request: SessionOpen) -> SessionOpened:
        """Create-or-check the session, claim it for the run, and load its history."""
        who = caller(ctx)
        # A session made by this open has no history (nothing stored under its id belongs to
        # its new incarnation), so the read is only worth starting before the record is known
        # when the session is known to exist; else it waits for the record.
        known = self.records.cache.heard_of(subjects.session_key(who.tenant, request.session_id))
        reading = asyncio.ensure_future(self._read(ctx, who, request.session_id)) if known else None
        try:
            displaced: list[str] = []

            def claim(current: SessionRecord) -> SessionRecord:
                claimed, previous = core.claim(
                    current, ctx.run_id, ctx.deadline, request.policy, time.time()
                )
                displaced[:] = [previous] if previous else []
                return claimed

            record, created = await self._get_or_create(
                ctx, who, request.session_id, claim, look_first=known
            )
            if not created:
                record = await self._update(record, claim)
        except BaseException:
            if reading is not None:
                reading.cancel()
            raise
        if displaced:
            # The displaced run stops at its next step; its messages so far stay in history.
            await self._cancel_run(who, displaced[0])
        if created:
            if reading is not None:
                reading.cancel()
            # End 0, even over what a deleted session of this id left behind: the run's first
            # direct checkpoint, conditional on it, is then refused and goes through append.
            history = History([], False, 0)
        else:
            stored = await (reading or self._read(ctx, who, request.session_id))
            history = await self._history(ctx, who, stored, record)
        return SessionOpened(
            record=record,
            messages=core.last_turns(core.repair(history.messages), request.last_turns),
            created=created,
            interrupted_run=displaced[0] if displaced else None,
            history_end=history.end,
        )

    async def on_get(self, ctx: RunContext, request: SessionGet) -> SessionInfo:
        who = caller(ctx)
        record = await self.records.get(who.tenant, request.session_id)
        return SessionInfo(record=core.owned(record, who.user_id, request.session_id))

    async def on_list(self, ctx: RunContext, request: SessionList) -> SessionListed:
        who = caller(ctx)
        mine = [r for r in await self.records.list(who.tenant) if r.owner == who.user_id]
        mine.sort(key=lambda r: r.updated_at, reverse=True)
        listed, size = [], 0
        for record in mine[: request.limit]:
            size += len(BATCH_ENCODER.encode(record))
            if size > self.reply_limit:
                break
            listed.append(record)
        return SessionListed(records=listed, more=len(listed) < min(len(mine), request.limit))

    async def on_state_update(self, ctx: RunContext, request: SessionStateUpdate) -> SessionInfo:
        who = caller(ctx)
        record = core.owned(
            await self.records.get(who.tenant, request.session_id),
            who.user_id,
            request.session_id,
        )
        if request.expected_revision is not None and request.expected_revision != record.revision:
            raise RevisionConflict(request.session_id, request.expected_revision, record.revision)

        def change(current: SessionRecord) -> SessionRecord:
            state = dict(current.state)
            if request.value is None:
                state.pop(request.key, None)
            else:
                state[request.key] = request.value
            return msgspec.structs.replace(current, state=state, updated_at=datetime.now(UTC))

        if request.expected_revision is not None:
            try:
                updated = await self.records.update(change(record))
            except StaleRevision:
                latest = await self.records.get(who.tenant, request.session_id)
                raise RevisionConflict(
                    request.session_id,
                    request.expected_revision,
                    latest.revision if latest else 0,
                ) from None
        else:
            updated = await self._update(record, change)
        return SessionInfo(record=updated)

    async def on_export(self, ctx: RunContext, request: SessionExport) -> SessionExported:
        """The session as a document: all of it when it fits in one reply, or one page of it
        (`after`): the batches and compactions stored in a stretch of the stream, in order."""
        who = caller(ctx)
        record = core.owned(
            await self.records.get(who.tenant, request.session_id),
            who.user_id,
            request.session_id,
        )
        paged = request.after is not None
        after = request.after or 0
        budget = self.page_bytes if paged else self.reply_limit
        log = subjects.history_log(who.tenant, request.session_id)
        markers = subjects.history_compactions(who.tenant, request.session_id)
        page = await self._page(ctx, log, after + 1, budget // 2)
        # The compactions stored among those batches (or after them, on the last page).
        placed = await self._page(ctx, markers, after + 1, budget - page.size, stop=page.more)
        items, more = page.items, page.more
        if placed.more is not None:
            # No room for every compaction of the stretch: the page ends at the last that fit.
            items = [(s, data) for s, data in items if s <= placed.more]
            more = placed.more
        if not paged and more is not None:
            raise HistoryTooLarge(
                request.session_id,
                "the export",
                "export it in pages (SessionExport.after=0, then each reply's next_after; "
                "`runbus sessions export` does)",
                size=page.size + placed.size,
                limit=self.reply_limit,
            )
        batches = [(s, BATCH_DECODER.decode(data)) for s, data in items]
        messages, compactions = core.document_history(
            batches,
            [(s, core.COMPACTION_DECODER.decode(data)) for s, data in placed.items],
            record.incarnation,
        )
        return SessionExported(
            document=SessionDocument(
                record=msgspec.structs.replace(record, revision=0, incarnation=""),
                messages=messages,
                compactions=compactions,
                abandoned_runs=core.abandoned_runs([b for _, b in batches], record.incarnation),
            ),
            next_after=more,
        )

    async def on_import(self, ctx: RunContext, request: SessionImport) -> SessionInfo:
        """Make a session from a document, in one request or in parts: the first part creates
        it (held by the import while `more` parts follow), each later part names it by the
        incarnation the first one made (`part_of`) and stores its messages after the others."""
        who = caller(ctx)
        record = request.document.record
        if record.tenant != who.tenant or record.owner != who.user_id:
            raise ForeignDocument()
        if not is_identifier(record.session_id):
            raise SessionNotFound(record.session_id)
        core.check_creatable(record.session_id, who.tenant, who.user_id)
        incarnation = request.part_of or core.new_incarnation()
        holder = f"import-{incarnation}"
        # While parts follow, the import holds the session as a run would.
        claim = time.time() + SESSION_IMPORT_CLAIM if request.more else None
        if request.part_of:
            target = core.owned(
                await self.records.get(who.tenant, record.session_id),
                who.user_id,
                record.session_id,
            )
            if target.incarnation != request.part_of:
                raise SessionNotFound(record.session_id)
        else:
            created = await self.records.create(
                msgspec.structs.replace(
                    record,
                    revision=0,
                    incarnation=incarnation,
                    active_run=holder if claim else None,
                    claim_expires=claim,
                )
            )
            if created is None:
                raise SessionExists(record.session_id)
            target = created
            # Only once the record is the caller's: what is purged is a leftover of a session
            # deleted half-way, never the history of a session that exists (maybe someone
            # else's).
            await self._purge(who, record.session_id)
        await self._store_document(who, target, request.document)
        if request.part_of and (claim is not None or target.active_run == holder):
            # Hold it on while parts follow; let go with the last.
            target = await self._update(
                target,
                lambda r: (
                    msgspec.structs.replace(
                        r,
                        active_run=holder if claim else None,
                        claim_expires=claim,
                    )
                    if r.active_run in (holder, None)
                    else r
                ),
            )
        return SessionInfo(record=target)

    async def _store_document(
        self, who: Owner, record: SessionRecord, document: SessionDocument
    ) -> None:
        """Store a document's (or a part's) messages and compactions for `record`, in order."""
        subject = subjects.history_log(who.tenant, record.session_id)
        markers = subjects.history_compactions(who.tenant, record.session_id)
        # De-duplication ids of this import alone: the same document imported again after a
        # delete, within the duplicate window, must be stored again, not taken for a retry.
        nonce = f"import-{record.incarnation}:"
        for part in core.document_chunks(document.messages, document.compactions, IMPORT_CHUNK):
            if isinstance(part, list):
                for chunk in core.chunks_of_size(part, self.page_bytes):
                    batch = StoredBatch(messages=chunk, incarnation=record.incarnation)
                    data = BATCH_ENCODER.encode(batch)
                    await store.append(self.nc, subject, data, nonce + batch_id(subject, chunk))
            else:
                compaction = compaction_to_store(part, record.incarnation)
                data = BATCH_ENCODER.encode(compaction)
                msg_id = nonce + compaction_id(markers, compaction)
                await store.append(self.nc, markers, data, msg_id)
        for run_id in document.abandoned_runs:
            await self._abandon(subject, run_id, record.incarnation, nonce)

    async def _abandon(self, subject: str, run_id: str, incarnation: str, nonce: str = "") -> None:
        """Mark `run_id` as failed for good on the session's `subject`: later loads leave its
        messages out (they stay stored)."""
        marker = StoredBatch(messages=[], incarnation=incarnation, abandoned_run=run_id)
        msg_id = nonce + abandon_id(subject, run_id)
        await store.append(self.nc, subject, BATCH_ENCODER.encode(marker), msg_id)

    async def on_delete(self, ctx: RunContext, request: SessionDelete) -> SessionDeleted:
        who = caller(ctx)
        record = core.owned(
            await self.records.get(who.tenant, request.session_id),
            who.user_id,
            request.session_id,
        )
        if (running := core.live_run(record, time.time())) is not None:
            # A run still working on the session stops now rather than writing on into a
            # session that is gone (and maybe made again by someone else by then).
            await self._cancel_run(who, running)
        await self._purge(who, request.session_id)
        await self.records.delete(who.tenant, request.session_id)
        return SessionDeleted(
            session_id=request.session_id,
            memories_forgotten=await self._forget_memories(ctx, request.session_id),
        )

    async def _forget_memories(self, ctx: RunContext, session_id: str) -> bool:
        """Ask memory to forget what the caller stored from the session. The session is gone
        either way; the reply says whether memory confirmed, so a caller can retry that part."""
        try:
            await self.bus.call(ops.MEMORY_FORGET, MemoryForget(session_id=session_id), ctx=ctx)
        except RunbusError as exc:
            self.log.warning(
                "session_memories_not_forgotten", session_id=session_id, reason=str(exc)
            )
            return False
        return True

    # -- helpers -------------------------------------------------------------------------

    async def _purge(self, who: Owner, session_id: str) -> None:
        """Remove every batch and compaction stored under the caller's session `session_id`."""
        await store.purge(self.nc, subjects.history_log(who.tenant, session_id))
        await store.purge(self.nc, subjects.history_compactions(who.tenant, session_id))

    async def _cancel_run(self, who: Owner, run_id: str) -> None:
        """Tell the caller's run `run_id` to stop (every replica of every service hears it)."""
        await self.nc.publish(subjects.run_cancel(who.tenant, who.user_id, run_id), b"")

    def _timeout(self, ctx: RunContext) -> float:
        left = ctx.time_left()
        return self.bus.request_timeout if left is None else min(left, self.bus.request_timeout)

    async def _read(
        self, ctx: RunContext, who: Owner, session_id: str, *, originals: bool = False
    ) -> Stored:
        """What is stored under the session id: the latest compaction, then only the batches
        stored after it. `originals` reads every batch and ignores compactions (audit)."""
        timeout = self._timeout(ctx)
        compaction: HistoryCompaction | None = None
        start, size = 1, 0
        if not originals:
            latest = await store.last(
                self.nc, subjects.history_compactions(who.tenant, session_id), timeout
            )
            if latest is not None:
                start = latest[0] + 1
                compaction = core.COMPACTION_DECODER.decode(latest[1])
                size = len(latest[1])
        subject = subjects.history_log(who.tenant, session_id)
        batches: list[StoredBatch] = []
        # Where the stored batches end: the last one read; 0 when none is stored at all;
        # unknown (None) when a compaction's read skipped them all.
        end: int | None = 0 if start == 1 else None
        async for sequence, data in store.read_subject(self.nc, subject, timeout, start):
            batches.append(BATCH_DECODER.decode(data))
            end = sequence
            size += len(data)
        return Stored(batches, compaction, end, size)

    async def _page(
        self, ctx: RunContext, subject: str, start: int, budget: int, stop: int | None = None
    ) -> Page:
        """What is stored on `subject` from stream sequence `start` on (to `stop` at most),
        as many as fit in `budget` bytes, and at least one."""
        items: list[tuple[int, bytes]] = []
        size = 0
        more: int | None = None
        reading = store.read_subject(self.nc, subject, self._timeout(ctx), start)
        async with contextlib.aclosing(reading):
            async for sequence, data in reading:
                if stop is not None and sequence > stop:
                    break
                if items and size + len(data) > budget:
                    more = items[-1][0]
                    break
                items.append((sequence, data))
                size += len(data)
        return Page(items, size, more)

    async def _load_pages(self, ctx: RunContext, who: Owner, request: HistoryLoad) -> HistoryLoaded:
        """A page of the stored history (`after` given), or all of it in one reply (`originals`
        without `after`) when it fits: read up to a reply's worth, never more."""
        record = core.owned(
            await self.records.recent(who.tenant, request.session_id),
            who.user_id,
            request.session_id,
        )
        paged = request.after is not None
        after = request.after or 0
        compaction: HistoryCompaction | None = None
        compacted = False
        start, size = after + 1, 0
        if not request.originals:
            markers = subjects.history_compactions(who.tenant, request.session_id)
            latest = await store.last(self.nc, markers, self._timeout(ctx))
            if latest is not None:
                found = core.COMPACTION_DECODER.decode(latest[1])
                if core.of_incarnation(found.incarnation, record.incarnation):
                    compacted = True
                    start = max(start, latest[0] + 1)
                    # Its messages open the first page only.
                    compaction = found if after < latest[0] else None
                    size = len(latest[1]) if compaction is not None else 0
        budget = self.page_bytes if paged else self.reply_limit
        log = subjects.history_log(who.tenant, request.session_id)
        page = await self._page(ctx, log, start, max(budget - size, 0))
        if not paged and page.more is not None:
            raise HistoryTooLarge(
                request.session_id,
                "the stored history",
                "read it in pages (HistoryLoad.after=0, then each reply's next_after; "
                "`runbus history --originals` does)",
                size=size + page.size,
                limit=self.reply_limit,
            )
        batches = [BATCH_DECODER.decode(data) for _, data in page.items]
        messages = core.loaded(batches, compaction, record.incarnation, abandoned=request.originals)
        if not paged:
            messages = core.last_turns(core.repair(messages), request.last_turns)
        return HistoryLoaded(
            messages=messages,
            compacted=compacted,
            next_after=page.more,
        )

    async def _history(
        self, ctx: RunContext, who: Owner, stored: Stored, record: SessionRecord
    ) -> History:
        """The history of `record`'s incarnation in what `stored` found. A latest compaction
        of another incarnation (written by a run of a session deleted since, in the moment a
        record copy lags) cannot be started from: then every batch is read again, and those
        of this incarnation are its history, uncompacted (stored nowhere else)."""
        if stored.compaction is not None and not core.of_incarnation(
            stored.compaction.incarnation, record.incarnation
        ):
            stored = await self._read(ctx, who, record.session_id, originals=True)
        messages = core.loaded(stored.batches, stored.compaction, record.incarnation)
        if stored.size > self.window or (
            len(stored.batches) > WINDOW_BATCHES and stored.size > self.window // 2
        ):
            windowed = await self._windowed(who, record, messages, stored.end)
            return History(windowed, True, stored.end)
        return History(messages, stored.compaction is not None, stored.end)

    async def _windowed(
        self, who: Owner, record: SessionRecord, messages: list[ChatMessage], end: int | None
    ) -> list[ChatMessage]:
        """The last whole turns of `messages` that fit in half the window (at least the last
        turn), stored as a persisted compaction when the session's messages still end at
        `end`, so that later loads read only those and what follows. A last turn larger than a
        reply can carry is refused with a typed error."""
        sizes = [len(BATCH_ENCODER.encode(m)) for m in messages]
        start = core.window_start(messages, sizes, self.window // 2)
        kept = sum(sizes[start:])
        limit = self.reply_limit - len(BATCH_ENCODER.encode(record))
        if kept > limit:
            raise HistoryTooLarge(
                record.session_id,
                "the last turn",
                "delete the session (export it first to keep it) or start a new one",
                size=kept,
                limit=limit,
            )
        if start == 0:
            return messages
        window = messages[start:]
        stored = False
        if end:
            excluded = [m.message_id for m in messages[:start]][-EXCLUDED_IDS:]
            compaction = compaction_to_store(
                HistoryCompaction(messages=window, excluded_message_ids=excluded),
                record.incarnation,
            )
            stored = await self._store_window(who, record.session_id, compaction, end)
        self.log.info(
            "history_windowed",
            session_id=record.session_id,
            kept=len(window),
            left_out=start,
            kept_bytes=kept,
            stored=stored,
        )
        return window

    async def _store_window(
        self, who: Owner, session_id: str, compaction: HistoryCompaction, end: int
    ) -> bool:
        """Store a window as the session's latest compaction if its messages still end at
        `end`. Whether it was stored: a window not stored (something was appended since, or
        the stream refused it) is only served, and the next load makes it again."""
        markers = subjects.history_compactions(who.tenant, session_id)
        data = BATCH_ENCODER.encode(compaction)
        if len(data) > self.nc.max_payload:
            return False
        try:
            return await store.append_after(
                self.nc,
                markers,
                data,
                compaction_id(markers, compaction),
                log=subjects.history_log(who.tenant, session_id),
                end=end,
            )
        except nats.errors.Error as exc:
            self.log.warning("history_window_not_stored", session_id=session_id, reason=str(exc))
            return False

    async def _get_or_create(
        self,
        ctx: RunContext,
        who: Owner,
        session_id: str,
        change: "core.RecordChange",
        *,
        look_first: bool = True,
    ) -> tuple[SessionRecord, bool]:
        """The caller's record and whether it is new; a new one is created with `change`
        applied (one write instead of two), an existing one is returned as stored.
        `look_first=False` (a session nobody here has heard of, most likely new) tries the
        create first, a compare-and-set on "no record": one that exists fails it and is read."""
        record = await self.records.get(who.tenant, session_id) if look_first else None
        if record is None:
            core.check_creatable(session_id, who.tenant, who.user_id)
            now = datetime.now(UTC)
            record = await self.records.create(
                change(
                    SessionRecord(
                        session_id=session_id,
                        tenant=who.tenant,
                        owner=who.user_id,
                        agent=ctx.agent,
                        created_at=now,
                        updated_at=now,
                        incarnation=core.new_incarnation(),
                    )
                )
            )
            if record is not None:
                return record, True
            record = await self.records.get(who.tenant, session_id)  # lost a creation race
            if record is None:
                # It exists (the create was refused for it), but the read was answered by a
                # replica still catching up: asked again later, not "no session".
                raise Unavailable(f"session {session_id!r} is not readable yet")
        return core.owned(record, who.user_id, session_id), False

    async def _update(self, record: SessionRecord, change: "core.RecordChange") -> SessionRecord:
        """Apply `change` with compare-and-set, re-reading and retrying when another writer won."""
        for _ in range(CAS_ATTEMPTS):
            try:
                return await self.records.update(change(record))
            except StaleRevision:
                # Re-read; a record that was deleted and created again by someone else
                # meanwhile is not the one being changed: not found, as a missing one.
                latest = await self.records.get(record.tenant, record.session_id)
                record = core.owned(latest, record.owner, record.session_id)
        raise RevisionConflict(record.session_id, record.revision, record.revision)
