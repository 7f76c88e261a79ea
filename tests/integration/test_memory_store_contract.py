"""One contract for every memory store: the embedded qdrant-edge shard and the qdrant-client
adapter (its `:memory:` mode stands in for a server) must behave the same to a user."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import pytest
from qdrant_client import AsyncQdrantClient

from runbus.messages.memory import SearchScope
from runbus_memory.core import MemoryRecord, StorageScope, memory_id
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.errors import VectorSizeMismatch
from runbus_memory.stores import MemoryStore, QdrantClientStore

EMBEDDER = HashingEmbedder()
DIMENSION = EMBEDDER.dimension

ALICE_S1 = StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="travel")
ALICE_S2 = StorageScope(tenant="acme", user_id="alice", session_id="s2", agent_id="travel")
ALICE_CHEF = StorageScope(tenant="acme", user_id="alice", session_id="s3", agent_id="chef")
BOB = StorageScope(tenant="acme", user_id="bob", session_id="s9", agent_id="travel")
OTHER_ALICE = StorageScope(tenant="globex", user_id="alice", session_id="s1", agent_id="travel")

WINDOW_SEAT = "I always want a window seat on flights"
ALL_SCOPES: tuple[SearchScope, ...] = ("tenant", "user", "session", "agent")


class Adapter(Protocol):
    async def open(self, dimension: int = DIMENSION) -> MemoryStore: ...

    async def reopen(self, store: MemoryStore, dimension: int = DIMENSION) -> MemoryStore:
        """The store as the next start of the memory service would see it."""
        ...

    async def close(self) -> None: ...


class EdgeAdapter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.opened: list[MemoryStore] = []

    async def open(self, dimension: int = DIMENSION) -> MemoryStore:
        store = await EdgeStore.open(self.path, dimension)
        self.opened.append(store)
        return store

    async def reopen(self, store: MemoryStore, dimension: int = DIMENSION) -> MemoryStore:
        # The shard holds a lock on its WAL, so the old one must let go first, as a stopping
        # service does.
        await store.close()
        return await self.open(dimension)

    async def close(self) -> None:
        for store in self.opened:
            await store.close()


class ClientAdapter:
    def __init__(self) -> None:
        # One client holds the data across "restarts", as a Qdrant server would.
        self.client = AsyncQdrantClient(location=":memory:")

    async def open(self, dimension: int = DIMENSION) -> MemoryStore:
        return await QdrantClientStore.attach(self.client, dimension)

    async def reopen(self, store: MemoryStore, dimension: int = DIMENSION) -> MemoryStore:
        return await self.open(dimension)

    async def close(self) -> None:
        await self.client.close()


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
    await store.upsert(records, EMBEDDER.embed(list(texts)))
    return [r.memory_id for r in records]


async def recall(
    store: MemoryStore, searcher: StorageScope, scope: SearchScope, query: str, limit: int = 10
) -> list[tuple[MemoryRecord, float]]:
    (vector,) = EMBEDDER.embed([query])
    return await store.search(vector, searcher.search_filter(scope), limit)


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
