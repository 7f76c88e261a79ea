"""The memory service: store under the full storage scope, search in the agent's search scope."""

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import subjects
from runbus.headers import RunContext
from runbus.messages import MemoryHit, MemoryHits, MemorySearch, MemoryStore, MemoryStored
from runbus.messages.memory import MEMORY_SEARCH_DECODER, MEMORY_STORE_DECODER
from runbus.service import Endpoint, Service
from runbus.settings import Settings

from .core import MemoryRecord, StorageScope, memory_id
from .edge import EdgeStore
from .embedder import Embedder, HashingEmbedder
from .errors import StoreNotConfigured
from .stores import MemoryStore as Store
from .stores import QdrantClientStore


class MemoryService(Service):
    name = "memory"
    description = "Long-term semantic memory in Qdrant"

    def __init__(
        self,
        nc: NATS,
        *,
        embedder: Embedder,
        store: Store | None = None,
        qdrant_url: str | None = None,
        data_dir: Path | None = None,
        **kwargs: object,
    ) -> None:
        """`store` wins (tests inject one); else a Qdrant server at `qdrant_url`; else the
        embedded shard in `data_dir`."""
        super().__init__(nc, **kwargs)  # type: ignore[arg-type]
        self.embedder = embedder
        self.store = store
        self.qdrant_url = qdrant_url
        self.data_dir = data_dir

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(
            nc,
            embedder=HashingEmbedder(),
            qdrant_url=settings.qdrant_url,
            data_dir=settings.data_path / "qdrant",
            tracer_provider=tracer_provider,
            request_timeout=settings.request_timeout,
        )

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("store", subjects.MEMORY_STORE, MEMORY_STORE_DECODER, self.on_store),
            Endpoint("search", subjects.MEMORY_SEARCH, MEMORY_SEARCH_DECODER, self.on_search),
        ]

    async def on_start(self) -> None:
        if self.store is None:
            self.store = await self._open_store()

    async def _open_store(self) -> Store:
        if self.qdrant_url:
            return await QdrantClientStore.open(self.embedder.dimension, url=self.qdrant_url)
        if self.data_dir is None:
            raise StoreNotConfigured()
        return await EdgeStore.open(self.data_dir, self.embedder.dimension)

    async def on_stop(self) -> None:
        if self.store is not None:
            await self.store.close()

    def _store(self) -> Store:
        assert self.store is not None, "start() opens the store"
        return self.store

    async def on_store(self, ctx: RunContext, request: MemoryStore) -> MemoryStored:
        scope = StorageScope.from_context(ctx)
        now = datetime.now(UTC)
        records = [
            MemoryRecord(memory_id=memory_id(scope, t), text=t.strip(), scope=scope, created_at=now)
            for t in request.texts
        ]
        vectors = await asyncio.to_thread(self.embedder.embed, [r.text for r in records])
        await self._store().upsert(records, vectors)
        return MemoryStored(memory_ids=[r.memory_id for r in records])

    async def on_search(self, ctx: RunContext, request: MemorySearch) -> MemoryHits:
        scope = StorageScope.from_context(ctx)
        if not request.query.strip():
            return MemoryHits(hits=[])
        (vector,) = await asyncio.to_thread(self.embedder.embed, [request.query])
        found = await self._store().search(
            vector, scope.search_filter(request.scope), request.limit
        )
        return MemoryHits(
            hits=[
                MemoryHit(
                    memory_id=record.memory_id,
                    text=record.text,
                    score=score,
                    session_id=record.scope.session_id,
                    created_at=record.created_at,
                )
                for record, score in found
            ]
        )
