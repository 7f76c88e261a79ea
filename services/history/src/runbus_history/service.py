"""The history service: thin handlers over `core` (rules), `store` (the history stream) and
`records` (session records in KV)."""

import asyncio
import time
from datetime import UTC, datetime
from typing import Final, NamedTuple, Self

import msgspec
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import ops, subjects
from runbus.errors import RunbusError
from runbus.headers import RunContext
from runbus.history_batches import (
    batch_id,
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
    MissingIdentity,
    RevisionConflict,
    SessionExists,
    SessionNotFound,
)
from .records import SessionRecords, StaleRevision

CAS_ATTEMPTS: Final = 20
IMPORT_CHUNK: Final = 100


class Stored(NamedTuple):
    """What a read found stored under a session id, before it is matched to the record's
    incarnation (the read starts before the record is known)."""

    batches: list[StoredBatch]
    compaction: HistoryCompaction | None
    """The latest persisted compaction the read started from (None: from the first batch)."""
    end: int | None
    """Stream sequence of the last stored batch (0: none); None when the read did not see it."""


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
        options: ServiceOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(nc, options=options)
        self.replicas = replicas
        self.max_age = max_age
        self.max_appends_per_session = max_appends_per_session
        self._records: SessionRecords | None = None

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
            data = BATCH_ENCODER.encode(StoredBatch(messages=to_store, incarnation=incarnation))
            end = await store.append(self.nc, subject, data, batch_id(subject, to_store))
            stored, skipped = (len(to_store), skipped) if end else (0, len(request.messages))
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
        return SessionListed(records=mine[: request.limit])

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
        who = caller(ctx)
        record = core.owned(
            await self.records.get(who.tenant, request.session_id),
            who.user_id,
            request.session_id,
        )
        timeout = self._timeout(ctx)
        batches = [
            (sequence, BATCH_DECODER.decode(data))
            async for sequence, data in store.read_subject(
                self.nc, subjects.history_log(who.tenant, request.session_id), timeout
            )
        ]
        compactions = [
            (sequence, core.COMPACTION_DECODER.decode(data))
            async for sequence, data in store.read_subject(
                self.nc, subjects.history_compactions(who.tenant, request.session_id), timeout
            )
        ]
        messages, placed = core.document_history(batches, compactions, record.incarnation)
        return SessionExported(
            document=SessionDocument(
                record=msgspec.structs.replace(record, revision=0, incarnation=""),
                messages=messages,
                compactions=placed,
            )
        )

    async def on_import(self, ctx: RunContext, request: SessionImport) -> SessionInfo:
        who = caller(ctx)
        record = request.document.record
        if record.tenant != who.tenant or record.owner != who.user_id:
            raise ForeignDocument()
        if not is_identifier(record.session_id):
            raise SessionNotFound(record.session_id)
        subject = subjects.history_log(who.tenant, record.session_id)
        created = await self.records.create(
            msgspec.structs.replace(record, revision=0, incarnation=core.new_incarnation())
        )
        if created is None:
            raise SessionExists(record.session_id)
        # Only once the record is the caller's: what is purged is a leftover of a session
        # deleted half-way, never the history of a session that exists (maybe someone else's).
        await self._purge(who, record.session_id)
        markers = subjects.history_compactions(who.tenant, record.session_id)
        document = request.document
        # De-duplication ids of this import alone: the same document imported again after a
        # delete, within the duplicate window, must be stored again, not taken for a retry.
        nonce = f"import-{created.revision}:"
        for part in core.document_chunks(document.messages, document.compactions, IMPORT_CHUNK):
            if isinstance(part, list):
                batch = StoredBatch(messages=part, incarnation=created.incarnation)
                data = BATCH_ENCODER.encode(batch)
                await store.append(self.nc, subject, data, nonce + batch_id(subject, part))
            else:
                compaction = compaction_to_store(part, created.incarnation)
                data = BATCH_ENCODER.encode(compaction)
                msg_id = nonce + compaction_id(markers, compaction)
                await store.append(self.nc, markers, data, msg_id)
        return SessionInfo(record=created)

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
        start = 1
        if not originals:
            latest = await store.last(
                self.nc, subjects.history_compactions(who.tenant, session_id), timeout
            )
            if latest is not None:
                start = latest[0] + 1
                compaction = core.COMPACTION_DECODER.decode(latest[1])
        subject = subjects.history_log(who.tenant, session_id)
        batches: list[StoredBatch] = []
        # Where the stored batches end: the last one read; 0 when none is stored at all;
        # unknown (None) when a compaction's read skipped them all.
        end: int | None = 0 if start == 1 else None
        async for sequence, data in store.read_subject(self.nc, subject, timeout, start):
            batches.append(BATCH_DECODER.decode(data))
            end = sequence
        return Stored(batches, compaction, end)

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
        return History(messages, stored.compaction is not None, stored.end)

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
