"""The history replica's record cache: a hit is never older than the last write it heard of."""

from datetime import UTC, datetime

from runbus.messages.sessions import SessionRecord
from runbus_history.cache import RecordCache

KEY = "acme.s1"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def record(owner: str, revision: int, session_id: str = "s1") -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        tenant="acme",
        owner=owner,
        agent="travel",
        created_at=NOW,
        updated_at=NOW,
        revision=revision,
    )


def owner(cache: RecordCache, key: str = KEY) -> str | None:
    cached = cache.get(key)
    return cached.owner if cached is not None else None


def test_a_record_read_is_remembered_at_its_revision() -> None:
    cache = RecordCache()
    cache.remember(KEY, record("alice", revision=5))

    assert cache.get(KEY) == record("alice", revision=5)
    assert cache.get("acme.s2") is None


def test_a_write_newer_than_the_entry_drops_it() -> None:
    cache = RecordCache()
    cache.remember(KEY, record("alice", revision=5))

    cache.written(KEY, sequence=9)

    assert cache.get(KEY) is None


def test_hearing_of_the_write_the_entry_came_from_keeps_it() -> None:
    cache = RecordCache()
    cache.remember(KEY, record("alice", revision=5))  # this replica's own compare-and-set

    cache.written(KEY, sequence=5)

    assert owner(cache) == "alice"


def test_a_read_older_than_a_write_already_heard_of_is_not_remembered() -> None:
    cache = RecordCache()
    cache.written(KEY, sequence=9)  # e.g. a delete that raced the read below

    cache.remember(KEY, record("alice", revision=5))

    assert cache.get(KEY) is None


def test_an_older_read_does_not_replace_a_newer_entry() -> None:
    cache = RecordCache()
    cache.remember(KEY, record("bob", revision=9))
    cache.remember(KEY, record("alice", revision=5))

    assert owner(cache) == "bob"


def test_a_read_older_than_a_forgotten_write_is_not_remembered() -> None:
    cache = RecordCache(max_entries=2)
    cache.written("acme.a", sequence=10)
    cache.written("acme.b", sequence=11)
    cache.written("acme.c", sequence=12)  # forgets the write at 10 on acme.a

    cache.remember("acme.a", record("alice", revision=7, session_id="a"))  # maybe before it
    cache.remember("acme.d", record("dave", revision=13, session_id="d"))

    assert cache.get("acme.a") is None
    assert owner(cache, "acme.d") == "dave"


def test_the_cache_holds_at_most_max_entries() -> None:
    cache = RecordCache(max_entries=3)
    for index in range(10):
        cache.remember(f"acme.s{index}", record("alice", revision=index + 1))

    assert [owner(cache, f"acme.s{index}") for index in range(10)] == [None] * 7 + ["alice"] * 3


def test_forget_drops_the_entry_at_once() -> None:
    cache = RecordCache()
    cache.remember(KEY, record("alice", revision=5))

    cache.forget(KEY)

    assert cache.get(KEY) is None
