"""Changing the embedder of an embedded store (reembed.py): the shard made by the old one is
embedded again by the new one at start — every memory, retired ones too, with its id, date and
status; no vectors of two models in one shard; a copy cut short is finished by the next start;
and through the service, memories stored under one embedder are found under the next."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from runbus_memory.core import MemoryRecord, StorageScope, memory_id
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.reembed import ASIDE, open_edge, recorded_embedder
from runbus_memory.remote import OpenAIEmbedder
from runbus_memory.use import USEEmbedder
from tests.integration.test_memory_service import ALICE, WINDOW_SEAT, Deployment
from tests.stack import SecuredNats

from .memory_embeddings import embeddings_provider

SCOPE = StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="travel")
AT = datetime(2026, 1, 1, tzinfo=UTC)
ACTIVE = MemoryRecord(memory_id(SCOPE, "I live in Perth."), "I live in Perth.", SCOPE, AT)
RETIRED = MemoryRecord(
    memory_id(SCOPE, "I live in Sydney."),
    "I live in Sydney.",
    SCOPE,
    AT,
    status="superseded",
    superseded_by=ACTIVE.memory_id,
    retired_at=AT,
    retired_by="run-2",
)


async def a_shard_made_by(path: Path, embedder: HashingEmbedder) -> None:
    store = await EdgeStore.open(path, embedder.dimension, embedder="old-model")
    records = [ACTIVE, RETIRED]
    await store.upsert(records, embedder.vectors([r.text for r in records]))
    await store.close()


async def everything(store: EdgeStore) -> list[MemoryRecord]:
    records, _ = await store.scroll({}, 10, retired=True)
    return sorted(records, key=lambda r: r.text)


async def test_a_shard_of_another_embedder_is_embedded_again_with_every_memory_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "qdrant"
    await a_shard_made_by(path, HashingEmbedder(384))
    new = HashingEmbedder(128)  # another size: the old vectors could not even be searched

    store = await open_edge(path, new)
    try:
        assert await everything(store) == [ACTIVE, RETIRED]
        assert store.dimension == 128
        hits = await store.search(new.vectors(["I live in Perth."])[0], {"tenant": "acme"}, 5)
        assert [(r.text, round(score, 3)) for r, score in hits] == [("I live in Perth.", 1.0)]
    finally:
        await store.close()
    assert recorded_embedder(path) == "hashing"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qdrant"]


async def test_a_shard_of_the_configured_embedder_is_opened_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "qdrant"
    embedder = HashingEmbedder(384)
    store = await EdgeStore.open(path, 384, embedder="hashing")
    await store.upsert([ACTIVE], embedder.vectors([ACTIVE.text]))
    await store.close()

    reopened = await open_edge(path, embedder)
    try:
        assert await everything(reopened) == [ACTIVE]
    finally:
        await reopened.close()


async def test_a_copy_cut_short_by_a_crash_is_finished_at_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "qdrant"
    await a_shard_made_by(path, HashingEmbedder(384))
    path.rename(tmp_path / f"qdrant{ASIDE}")  # moved aside, then the process died
    partial = await EdgeStore.open(path, 128, embedder="hashing")  # and copied only one
    await partial.upsert([RETIRED], HashingEmbedder(128).vectors([RETIRED.text]))
    await partial.close()

    store = await open_edge(path, HashingEmbedder(128))
    try:
        assert await everything(store) == [ACTIVE, RETIRED]
    finally:
        await store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qdrant"]


@pytest.fixture
async def deployment(nats_server: SecuredNats, tmp_path: Path) -> Deployment:
    return Deployment(nats_server.url, tmp_path / "qdrant")


async def test_memories_stored_under_one_embedder_are_found_after_the_service_moves_to_use(
    deployment: Deployment,
) -> None:
    try:
        async with embeddings_provider() as provider:
            old = await OpenAIEmbedder.connect(provider.url, "loopback-embed")
            first = await deployment.start(embedder=old)
            memory = await deployment.client()
            await memory.store(ALICE, WINDOW_SEAT, "I'm allergic to peanuts.")
            await deployment.stop(first)

        await deployment.start(embedder=USEEmbedder.load_now())

        assert (await memory.search(ALICE, "帮我选一个飞机座位。"))[:1] == [WINDOW_SEAT]
        assert await memory.listed() == sorted([WINDOW_SEAT, "I'm allergic to peanuts."])
        stats = await memory.stats()
        assert (stats.embedder, stats.dimension) == (USEEmbedder.name, 512)
    finally:
        await deployment.close()
