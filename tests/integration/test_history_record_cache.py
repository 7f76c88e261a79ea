"""History replicas cache session records so appends skip the record read; a write on any
replica (a delete above all) reaches every replica's cache through the bucket watcher."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec
import nats
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue
from opentelemetry import trace

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages import ChatMessage, HistoryAppend, HistoryLoad, TextContent
from runbus.messages.history import (
    BATCH_ENCODER,
    HistoryCompaction,
    StoredBatch,
)
from runbus.messages.sessions import (
    SessionExport,
    SessionOpen,
    SessionRecord,
)
from runbus_history.cache import RecordCache
from runbus_history.records import SessionRecords
from runbus_history.service import HistoryService
from tests.helpers import eventually
from tests.stack import SecuredNats

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def record(owner: str, session_id: str = "s1") -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        tenant="acme",
        owner=owner,
        agent="travel",
        created_at=NOW,
        updated_at=NOW,
    )


@pytest.fixture
async def replicas(nats_server: SecuredNats) -> AsyncIterator[list[SessionRecords]]:
    """Two history replicas' views of the sessions bucket, each on its own connection."""
    connections = [await nats.connect(nats_server.url) for _ in range(2)]
    views = [await SessionRecords.open(nc) for nc in connections]
    yield views
    for view, nc in zip(views, connections, strict=True):
        await view.close()
        await nc.drain()


@pytest.fixture
async def other(nats_server: SecuredNats) -> AsyncIterator[SessionRecords]:
    """Another history replica's view of the sessions bucket, on a connection of its own."""
    connection = await nats.connect(nats_server.url)
    view = await SessionRecords.open(connection)
    yield view
    await view.close()
    await connection.drain()


@pytest.fixture
def bus(nc: NATS) -> Bus:
    return Bus(nc, trace.get_tracer("test"))


def count_gets(kv: KeyValue) -> list[str]:
    calls: list[str] = []
    get = kv.get

    async def counting_get(key: str, *args: object, **kwargs: object) -> KeyValue.Entry:
        calls.append(key)
        return await get(key, *args, **kwargs)  # type: ignore[arg-type]

    kv.get = counting_get  # type: ignore[method-assign]
    return calls


def count_heard(cache: RecordCache) -> list[int]:
    """Stream sequences of the writes the cache's watcher reports, as they arrive."""
    heard: list[int] = []
    written = cache.written

    def counting_written(key: str, sequence: int) -> None:
        heard.append(sequence)
        written(key, sequence)

    cache.written = counting_written  # type: ignore[method-assign]
    return heard


async def owner(records: SessionRecords, session_id: str = "s1") -> str | None:
    recent = await records.recent("acme", session_id)
    return recent.owner if recent is not None else None


async def test_a_session_deleted_and_recreated_elsewhere_changes_owner_on_every_replica(
    replicas: list[SessionRecords],
) -> None:
    cached, other = replicas
    await other.create(record("alice"))
    assert await owner(cached) == "alice"  # read once, now cached

    await other.delete("acme", "s1")
    await other.create(record("bob"))

    async def bob_owns_it() -> bool:
        return await owner(cached) == "bob"

    await eventually(bob_owns_it)


async def test_a_deleted_session_has_no_owner_on_the_replica_that_cached_it(
    replicas: list[SessionRecords],
) -> None:
    cached, other = replicas
    await other.create(record("alice"))
    assert await owner(cached) == "alice"

    await other.delete("acme", "s1")

    async def gone() -> bool:
        return await owner(cached) is None

    await eventually(gone)


async def test_appends_after_a_replicas_own_writes_read_no_record(
    replicas: list[SessionRecords],
) -> None:
    view, other = replicas
    gets = count_gets(view.kv)
    heard = count_heard(view.cache)
    created = await view.create(record("alice"))
    assert created is not None
    claimed = await view.update(msgspec.structs.replace(created, active_run="r-1"))
    await eventually(lambda: claimed.revision in heard)  # the cached revision, heard of

    owners = [await owner(view) for _ in range(5)]

    assert owners == ["alice"] * 5
    assert gets == []

    await other.update(msgspec.structs.replace(claimed, active_run=None))

    async def reread() -> bool:
        return await owner(view) == "alice" and gets == ["acme.s1"]

    await eventually(reread)


async def test_a_release_from_a_stale_cached_record_keeps_the_newer_write(
    history: HistoryService, other: SessionRecords, bus: Bus
) -> None:
    """The cache may lag a write (here its watcher is stopped outright); the releasing append
    then fails its compare-and-set, re-reads and keeps the other replica's change."""
    ctx = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})
    await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=ctx,
    )
    await history.records.close()  # from here on, history's cache hears of no write
    stored = await other.get("acme", "s1")
    assert stored is not None
    assert stored.active_run == "r-1"
    await other.update(msgspec.structs.replace(stored, state={"mode": "plan"}))

    appended = await bus.call(
        ops.HISTORY_APPEND,
        HistoryAppend(
            session_id="s1",
            messages=[ChatMessage(role="user", contents=[], message_id="r-1:in0")],
            release=True,
            history_length=1,
        ),
        ctx=ctx,
    )

    assert appended.stored == 1
    released = await other.get("acme", "s1")
    assert released is not None
    assert (released.active_run, released.history_length, released.state) == (
        None,
        1,
        {"mode": "plan"},
    )


async def test_opening_a_new_session_claims_it_in_the_write_that_creates_it(
    history: HistoryService, bus: Bus, nc: NATS
) -> None:
    ctx = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})
    bucket = f"KV_{subjects.SESSIONS_BUCKET}"
    before = (await nc.jetstream().stream_info(bucket)).state.last_seq

    opened = await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=ctx,
    )

    after = (await nc.jetstream().stream_info(bucket)).state.last_seq
    assert opened.created
    assert (opened.record.owner, opened.record.active_run) == ("alice", "r-1")
    assert opened.record.revision == after == before + 1


async def test_an_open_reads_stored_history_only_for_a_session_that_exists(
    history: HistoryService, bus: Bus
) -> None:
    """Making a session reads nothing stored (its history is empty by its incarnation), nor
    its record (the create is the check); an existing session's record and history are read
    whether or not this replica remembers it."""
    gets = count_gets(history.records.kv)
    reads: list[str] = []
    read = history._read

    async def counting_read(ctx: RunContext, who: object, session_id: str, **kw: bool) -> object:
        reads.append(session_id)
        return await read(ctx, who, session_id, **kw)  # type: ignore[arg-type]

    history._read = counting_read  # type: ignore[method-assign,assignment]
    ctx = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})

    async def open_and_release(run_id: str) -> list[str]:
        run = RunContext(run_id=run_id, props=ctx.props)
        opened = await bus.call(
            ops.SESSIONS_OPEN,
            SessionOpen(session_id="s1"),
            ctx=run,
        )
        said = ChatMessage(role="user", contents=[TextContent(text=run_id)], message_id=run_id)
        append = HistoryAppend(
            session_id="s1", messages=[said], release=True, incarnation=opened.record.incarnation
        )
        await bus.call(ops.HISTORY_APPEND, append, ctx=run)
        return [m.message_id for m in opened.messages]

    assert await open_and_release("r-1") == []
    assert (reads, gets) == ([], [])
    assert await open_and_release("r-2") == ["r-1"]
    history.records.cache = RecordCache()  # a replica that never heard of the session
    assert await open_and_release("r-3") == ["r-1", "r-2"]
    assert reads == ["s1", "s1"]
    record = await history.records.get("acme", "s1")
    assert record is not None
    assert record.active_run is None  # claimed and released again


async def test_a_new_session_never_shows_what_a_deleted_one_of_the_same_id_left_behind(
    history: HistoryService, bus: Bus, nc: NATS
) -> None:
    """An append that lands while its session is being deleted leaves a batch with no record:
    stamped with the old incarnation, or with none when that session was made before
    incarnations were kept. Whoever creates a session of that id next — here another user —
    starts empty and never reads it, nor a compaction left the same way, while what they
    append themselves is read."""
    log = subjects.history_log("acme", "s1")
    js = nc.jetstream()

    def secret(message_id: str) -> ChatMessage:
        text = TextContent(text="alice's secret")
        return ChatMessage(role="user", contents=[text], message_id=message_id)

    for incarnation in ("", "alices"):
        batch = StoredBatch(messages=[secret(f"r-old:in{incarnation}")], incarnation=incarnation)
        await js.publish(log, BATCH_ENCODER.encode(batch))
    compaction = HistoryCompaction(messages=[secret("r-old:sum")], incarnation="")
    await js.publish(subjects.history_compactions("acme", "s1"), BATCH_ENCODER.encode(compaction))
    bob = RunContext(run_id="r-bob", props={"tenant": "acme", "user_id": "bob"})
    opened = await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=bob,
    )
    mine = ChatMessage(role="user", contents=[TextContent(text="bob's")], message_id="r-bob:in0")
    await bus.call(
        ops.HISTORY_APPEND,
        HistoryAppend(session_id="s1", messages=[mine], incarnation=opened.record.incarnation),
        ctx=bob,
    )
    loaded = await bus.call(ops.HISTORY_LOAD, HistoryLoad(session_id="s1"), ctx=bob)
    exported = await bus.call(
        ops.SESSIONS_EXPORT,
        SessionExport(session_id="s1"),
        ctx=bob,
    )

    assert (opened.created, opened.record.owner, opened.history_end) == (True, "bob", 0)
    assert opened.messages == []
    assert [m.message_id for m in loaded.messages] == ["r-bob:in0"]
    assert [m.message_id for m in exported.document.messages] == ["r-bob:in0"]
    assert exported.document.compactions == []


async def test_a_release_never_changes_a_session_someone_else_created_since(
    history: HistoryService, other: SessionRecords, bus: Bus
) -> None:
    """alice's run releases a session that was deleted and created again by bob meanwhile
    (history's cache still holding alice's record): the compare-and-set fails, the re-read
    finds bob's record, and the release is refused instead of writing to it."""
    alice = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})
    await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=alice,
    )
    await history.records.close()  # from here on, history's cache hears of no write
    await other.delete("acme", "s1")
    bobs = await other.create(record("bob"))
    assert bobs is not None

    with pytest.raises(RemoteError) as refused:
        await bus.call(
            ops.HISTORY_APPEND,
            HistoryAppend(session_id="s1", messages=[], release=True, history_length=7),
            ctx=alice,
        )

    assert refused.value.remote_code == "not_found"
    assert await other.get("acme", "s1") == bobs


async def test_what_a_lagging_record_copy_lets_in_is_never_read_as_the_new_sessions(
    history: HistoryService, other: SessionRecords, bus: Bus, nc: NATS
) -> None:
    """alice's run r-1 still writes while her session is deleted and made again (the same id,
    the same owner). History's copy of the record lags (here its watcher is stopped outright),
    so the old run's append passes the owner check and is stored, compaction and all; but
    it names the session it opened, and the new one's loads, opens and export skip it."""
    old_run = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})
    opened = await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=old_run,
    )
    await history.records.close()  # from here on, history's cache hears of no write
    await other.delete("acme", "s1")
    made = await other.create(msgspec.structs.replace(record("alice"), incarnation="new"))
    assert made is not None
    old = said("r-1:m0", "the old conversation")
    late = await bus.call(
        ops.HISTORY_APPEND,
        HistoryAppend(
            session_id="s1",
            messages=[old],
            compaction=HistoryCompaction(
                messages=[said("r-1:sum", "a summary of the old conversation")],
                excluded_message_ids=["r-2:in0"],
            ),
            incarnation=opened.record.incarnation,
        ),
        ctx=old_run,
    )
    assert late.stored == 1  # let in by the lagging copy: what this test is about
    new_run = RunContext(run_id="r-2", props={"tenant": "acme", "user_id": "alice"})
    await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=new_run,
    )
    # A replica that did not serve that open may still hold the old record: the new run's
    # append, naming the new incarnation, has it read again and is accepted.
    history.records.cache = RecordCache()
    history.records.cache.remember(subjects.session_key("acme", "s1"), opened.record)
    rereads = count_gets(history.records.kv)
    appended = await bus.call(
        ops.HISTORY_APPEND,
        HistoryAppend(
            session_id="s1",
            messages=[said("r-2:in0", "the new conversation")],
            release=True,
            history_length=1,
            incarnation="new",
        ),
        ctx=new_run,
    )

    assert rereads == ["acme.s1"]

    third = RunContext(run_id="r-3", props={"tenant": "acme", "user_id": "alice"})
    reopened = await bus.call(
        ops.SESSIONS_OPEN,
        SessionOpen(session_id="s1"),
        ctx=third,
    )
    exported = await bus.call(
        ops.SESSIONS_EXPORT,
        SessionExport(session_id="s1"),
        ctx=third,
    )

    assert [m.message_id for m in reopened.messages] == ["r-2:in0"]
    assert reopened.history_end == appended.history_end  # where a direct checkpoint follows
    assert [m.message_id for m in exported.document.messages] == ["r-2:in0"]
    assert exported.document.compactions == []
    assert exported.document.record.incarnation == ""


def said(message_id: str, text: str) -> ChatMessage:
    return ChatMessage(role="user", contents=[TextContent(text=text)], message_id=message_id)
