"""One contract for every memory store: the embedded qdrant-edge shard and the qdrant-client
adapter (its `:memory:` mode stands in for a server) must behave the same to a user."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import pytest
from qdrant_client import AsyncQdrantClient, models
from qdrant_edge import Point, UpdateOperation

from runbus.messages.memory import SearchScope
from runbus_memory.core import MemoryRecord, StorageScope, memory_id
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.errors import EmbedderMismatch, VectorSizeMismatch
from runbus_memory.qdrant import QdrantClientStore
from runbus_memory.stores import COLLECTION, MemoryStore

EMBEDDER = HashingEmbedder()
DIMENSION = EMBEDDER.dimension

ALICE_S1 = StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="travel")
ALICE_S2 = StorageScope(tenant="acme", user_id="alice", session_id="s2", agent_id="travel")
ALICE_CHEF = StorageScope(tenant="acme", user_id="alice", session_id="s3", agent_id="chef")
BOB = StorageScope(tenant="acme", user_id="bob", session_id="s9", agent_id="travel")
OTHER_ALICE = StorageScope(tenant="globex", user_id="alice", session_id="s1", agent_id="travel")
ALICE_WEB = StorageScope(
    tenant="acme", user_id="alice", session_id="s1", agent_id="travel", application_id="web"
)

WINDOW_SEAT = "I always want a window seat on flights"
ALL_SCOPES: tuple[SearchScope, ...] = ("tenant", "user", "session", "agent")


class Adapter(Protocol):
    async def open(self, dimension: int = DIMENSION, embedder: str | None = None) -> MemoryStore:
        """The store as the memory service opens it (`embedder`: the model of its vectors)."""
        ...

    async def reopen(
        self, store: MemoryStore, dimension: int = DIMENSION, embedder: str | None = None
    ) -> MemoryStore:
        """The store as the next start of the memory service would see it."""
        ...

    async def close(self) -> None: ...

    async def put_raw(
        self, store: MemoryStore, record: MemoryRecord, payload: dict[str, str]
    ) -> None:
        """Write a point with exactly `payload`, as an older version of the service did."""
        ...


class EdgeAdapter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.opened: list[MemoryStore] = []

    async def open(self, dimension: int = DIMENSION, embedder: str | None = None) -> MemoryStore:
        store = await EdgeStore.open(self.path, dimension, embedder=embedder)
        self.opened.append(store)
        return store

    async def reopen(
        self, store: MemoryStore, dimension: int = DIMENSION, embedder: str | None = None
    ) -> MemoryStore:
        # The shard holds a lock on its WAL, so the old one must let go first, as a stopping
        # service does.
        await store.close()
        return await self.open(dimension, embedder)

    async def close(self) -> None:
        for store in self.opened:
            await store.close()

    async def put_raw(
        self, store: MemoryStore, record: MemoryRecord, payload: dict[str, str]
    ) -> None:
        assert isinstance(store, EdgeStore)
        (vector,) = EMBEDDER.vectors([record.text])
        store.shard.update(
            UpdateOperation.upsert_points([Point(record.memory_id, vector, payload)])
        )


class ClientAdapter:
    def __init__(self) -> None:
        # One client holds the data across "restarts", as a Qdrant server would.
        self.client = AsyncQdrantClient(location=":memory:")

    async def open(self, dimension: int = DIMENSION, embedder: str | None = None) -> MemoryStore:
        return await QdrantClientStore.attach(self.client, dimension, embedder=embedder)

    async def reopen(
        self, store: MemoryStore, dimension: int = DIMENSION, embedder: str | None = None
    ) -> MemoryStore:
        return await self.open(dimension, embedder)

    async def close(self) -> None:
        await self.client.close()

    async def put_raw(
        self, store: MemoryStore, record: MemoryRecord, payload: dict[str, str]
    ) -> None:
        (vector,) = EMBEDDER.vectors([record.text])
        await self.client.upsert(
            COLLECTION,
            points=[models.PointStruct(id=record.memory_id, vector=vector, payload=payload)],
        )


@pytest.fixture(params=["edge", "qdrant_client"])
async def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Adapter]:
    made: Adapter = EdgeAdapter(tmp_path / "qdrant") if request.param == "edge" else ClientAdapter()
    yield made
    await made.close()


@pytest.fixture
async def store(adapter: Adapter) -> MemoryStore:
    return await adapter.open()


async def remember(store: MemoryStore, scope: StorageScope, *texts: str) -> list[str]:
    now = datetime.now(UTC)
    records = [MemoryRecord(memory_id(scope, t), t, scope, now) for t in texts]
    await store.upsert(records, EMBEDDER.vectors(list(texts)))
    return [r.memory_id for r in records]


async def recall(
    store: MemoryStore,
    searcher: StorageScope,
    scope: SearchScope,
    query: str,
    limit: int = 10,
    min_score: float | None = None,
) -> list[tuple[MemoryRecord, float]]:
    (vector,) = EMBEDDER.vectors([query])
    return await store.search(vector, searcher.search_filter(scope), limit, min_score)


async def everything(store: MemoryStore, owner: StorageScope) -> list[str]:
    records, _ = await store.scroll(owner.owner(), 1000)
    return sorted(r.text for r in records)


async def test_a_stored_memory_is_found_with_its_text_and_storage_scope(
    store: MemoryStore,
) -> None:
    (stored_id,) = await remember(store, ALICE_S1, WINDOW_SEAT)

    hits = await recall(store, ALICE_S1, "user", "window seat")

    assert [(record.memory_id, record.text, record.scope) for record, _ in hits] == [
        (stored_id, WINDOW_SEAT, ALICE_S1)
    ]


async def test_user_scope_finds_a_memory_from_another_session_of_the_same_user(
    store: MemoryStore,
) -> None:
    await remember(store, ALICE_S1, WINDOW_SEAT)

    hits = await recall(store, ALICE_S2, "user", "book me a seat")

    assert [record.text for record, _ in hits] == [WINDOW_SEAT]


@pytest.mark.parametrize("scope", ["user", "session", "agent"])
async def test_another_user_in_the_same_tenant_never_sees_the_memory(
    store: MemoryStore, scope: SearchScope
) -> None:
    await remember(store, ALICE_S1, WINDOW_SEAT)

    assert await recall(store, BOB, scope, WINDOW_SEAT) == []


@pytest.mark.parametrize("scope", ALL_SCOPES)
async def test_the_same_user_id_in_another_tenant_never_sees_the_memory(
    store: MemoryStore, scope: SearchScope
) -> None:
    await remember(store, ALICE_S1, WINDOW_SEAT)

    assert await recall(store, OTHER_ALICE, scope, WINDOW_SEAT) == []


async def test_session_scope_finds_only_memories_from_that_session(store: MemoryStore) -> None:
    await remember(store, ALICE_S1, "my seat preference is the window")
    await remember(store, ALICE_S2, "my seat preference is the aisle")

    hits = await recall(store, ALICE_S2, "session", "seat preference")

    assert [record.text for record, _ in hits] == ["my seat preference is the aisle"]


async def test_agent_scope_finds_only_memories_stored_through_that_agent(
    store: MemoryStore,
) -> None:
    await remember(store, ALICE_S1, "I prefer vegetarian meals on flights")
    await remember(store, ALICE_CHEF, "I prefer vegetarian recipes")

    hits = await recall(store, ALICE_CHEF, "agent", "vegetarian")

    assert [record.text for record, _ in hits] == ["I prefer vegetarian recipes"]


async def test_tenant_scope_finds_memories_of_every_user_in_the_tenant_only(
    store: MemoryStore,
) -> None:
    await remember(store, ALICE_S1, "the office is in Berlin")
    await remember(store, BOB, "the office has a rooftop")
    await remember(store, OTHER_ALICE, "the office is in Lisbon")

    hits = await recall(store, BOB, "tenant", "the office")

    assert sorted(record.text for record, _ in hits) == [
        "the office has a rooftop",
        "the office is in Berlin",
    ]


async def test_storing_the_same_statement_twice_keeps_one_memory(store: MemoryStore) -> None:
    first = await remember(store, ALICE_S1, WINDOW_SEAT)
    second = await remember(store, ALICE_S1, WINDOW_SEAT)

    hits = await recall(store, ALICE_S1, "user", WINDOW_SEAT)

    assert first == second
    assert [record.memory_id for record, _ in hits] == first


async def test_a_search_returns_at_most_limit_hits(store: MemoryStore) -> None:
    await remember(store, ALICE_S1, *(f"fact number {n} about trains" for n in range(8)))

    hits = await recall(store, ALICE_S1, "user", "fact about trains", limit=3)

    assert len(hits) == 3


async def test_hits_come_best_first(store: MemoryStore) -> None:
    await remember(
        store,
        ALICE_S1,
        "my dog is called Rex",
        "I always want a window seat",
        "I want a window seat on long flights",
    )

    hits = await recall(store, ALICE_S1, "user", "I always want a window seat")

    scores = [score for _, score in hits]
    assert hits[0][0].text == "I always want a window seat"
    assert hits[-1][0].text == "my dog is called Rex"
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == pytest.approx(1.0, abs=1e-4)


async def test_memories_survive_closing_and_reopening_the_store(adapter: Adapter) -> None:
    store = await adapter.open()
    await remember(store, ALICE_S1, WINDOW_SEAT)

    reopened = await adapter.reopen(store)

    assert [record.text for record, _ in await recall(reopened, ALICE_S2, "user", "seat")] == [
        WINDOW_SEAT
    ]


async def test_reopening_with_another_vector_size_fails_and_keeps_the_memories(
    adapter: Adapter,
) -> None:
    store = await adapter.open()
    await remember(store, ALICE_S1, WINDOW_SEAT)

    with pytest.raises(VectorSizeMismatch) as raised:
        await adapter.reopen(store, dimension=DIMENSION * 2)

    assert (raised.value.existing, raised.value.configured) == (DIMENSION, DIMENSION * 2)
    reopened = await adapter.open()
    assert [record.text for record, _ in await recall(reopened, ALICE_S1, "user", "seat")] == [
        WINDOW_SEAT
    ]


@pytest.mark.parametrize("scope", ALL_SCOPES)
async def test_another_application_of_the_same_user_never_sees_the_memory(
    store: MemoryStore, scope: SearchScope
) -> None:
    await remember(store, ALICE_WEB, WINDOW_SEAT)

    assert await recall(store, ALICE_S1, scope, WINDOW_SEAT) == []
    assert [r.text for r, _ in await recall(store, ALICE_WEB, scope, WINDOW_SEAT)] == [WINDOW_SEAT]


async def test_hits_below_the_score_threshold_are_left_out(store: MemoryStore) -> None:
    await remember(store, ALICE_S1, WINDOW_SEAT, "my dog is called Rex")

    hits = await recall(store, ALICE_S1, "user", WINDOW_SEAT, min_score=0.5)

    assert [record.text for record, _ in hits] == [WINDOW_SEAT]


async def test_scrolling_pages_through_every_memory_of_the_owner_once(store: MemoryStore) -> None:
    texts = [f"fact number {n}" for n in range(7)]
    await remember(store, ALICE_S1, *texts[:4])
    await remember(store, ALICE_S2, *texts[4:])
    await remember(store, BOB, "bob's fact")

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        records, cursor = await store.scroll(ALICE_S1.owner(), 3, cursor)
        seen.extend(r.text for r in records)
        pages += 1
        if cursor is None:
            break

    assert sorted(seen) == sorted(texts)
    assert pages == 3


async def test_counting_counts_only_matching_memories(store: MemoryStore) -> None:
    await remember(store, ALICE_S1, "one", "two")
    await remember(store, ALICE_WEB, "three")
    await remember(store, BOB, "four")

    assert await store.count(ALICE_S1.owner()) == 3
    assert await store.count(ALICE_S1.search_filter("user")) == 2
    assert await store.count(BOB.owner()) == 1


async def test_deleting_by_id_removes_only_the_owners_memory_with_that_id(
    store: MemoryStore,
) -> None:
    (alice_id,) = await remember(store, ALICE_S1, WINDOW_SEAT)
    (bob_id,) = await remember(store, BOB, WINDOW_SEAT)

    assert await store.delete(ALICE_S1.owner(), [bob_id]) == 0
    assert await store.delete(ALICE_S1.owner(), [alice_id]) == 1

    assert await everything(store, ALICE_S1) == []
    assert await everything(store, BOB) == [WINDOW_SEAT]


async def test_deleting_a_session_keeps_the_users_other_sessions(store: MemoryStore) -> None:
    await remember(store, ALICE_S1, "from the first session")
    await remember(store, ALICE_S2, "from the second session")

    forgotten = await store.delete({**ALICE_S1.owner(), "session_id": "s1"})

    assert forgotten == 1
    assert await everything(store, ALICE_S1) == ["from the second session"]


async def test_deleting_a_user_removes_every_memory_of_that_user_and_nothing_else(
    adapter: Adapter,
) -> None:
    store = await adapter.open()
    await remember(store, ALICE_S1, "a", "b")
    await remember(store, ALICE_CHEF, "c")
    await remember(store, ALICE_WEB, "d")
    await remember(store, BOB, "bob")
    await remember(store, OTHER_ALICE, "other alice")

    forgotten = await store.delete(ALICE_S1.owner())

    assert forgotten == 4
    reopened = await adapter.reopen(store)
    assert await reopened.count(ALICE_S1.owner()) == 0
    assert await everything(reopened, BOB) == ["bob"]
    assert await everything(reopened, OTHER_ALICE) == ["other alice"]


async def test_memories_stored_before_applications_existed_belong_to_no_application(
    adapter: Adapter,
) -> None:
    store = await adapter.open()
    old = MemoryRecord(memory_id(ALICE_S1, WINDOW_SEAT), WINDOW_SEAT, ALICE_S1, datetime.now(UTC))
    payload = old.payload()
    del payload["application_id"]
    await adapter.put_raw(store, old, payload)

    reopened = await adapter.reopen(store)

    assert [r.text for r, _ in await recall(reopened, ALICE_S2, "user", "seat")] == [WINDOW_SEAT]
    assert await recall(reopened, ALICE_WEB, "user", "seat") == []


async def test_reopening_with_another_embedder_of_the_same_size_fails_and_keeps_the_memories(
    adapter: Adapter,
) -> None:
    store = await adapter.open(embedder="model-a")
    await remember(store, ALICE_S1, WINDOW_SEAT)

    with pytest.raises(EmbedderMismatch) as raised:
        await adapter.reopen(store, embedder="model-b")

    assert (raised.value.existing, raised.value.configured) == ("model-a", "model-b")
    reopened = await adapter.open(embedder="model-a")
    assert [record.text for record, _ in await recall(reopened, ALICE_S1, "user", "seat")] == [
        WINDOW_SEAT
    ]


async def test_reopening_with_another_embedder_of_another_size_names_both_embedders(
    adapter: Adapter,
) -> None:
    store = await adapter.open(embedder="model-a")
    await remember(store, ALICE_S1, WINDOW_SEAT)

    with pytest.raises(EmbedderMismatch) as raised:
        await adapter.reopen(store, dimension=DIMENSION * 2, embedder="model-b")

    assert (raised.value.existing, raised.value.configured) == ("model-a", "model-b")


async def test_memories_from_before_embedders_were_recorded_are_taken_as_hashing(
    adapter: Adapter,
) -> None:
    store = await adapter.open()
    await remember(store, ALICE_S1, WINDOW_SEAT)

    with pytest.raises(EmbedderMismatch) as raised:
        await adapter.reopen(store, embedder="all-MiniLM-L6-v2-int8")

    assert raised.value.existing == "hashing"
    await adapter.open(embedder="hashing")


async def test_an_empty_store_takes_the_embedder_it_is_first_opened_with(
    adapter: Adapter,
) -> None:
    store = await adapter.open()

    reopened = await adapter.reopen(store, embedder="model-a")

    with pytest.raises(EmbedderMismatch):
        await adapter.reopen(reopened, embedder="model-b")
