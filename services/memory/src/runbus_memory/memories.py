"""What the memory service does, without a bus: embed and store under a storage scope, search
inside a search scope, list, forget and count a user's memories. One embedder, one store."""

import uuid
from typing import Final

from runbus.errors import BadRequest

from .core import Match, MemoryRecord, StorageScope, distinct
from .embedder import Embedder
from .errors import VectorSizeMismatch
from .stores import MemoryStore

OVERFETCH: Final = 4
"""Hits asked of the store per hit returned, so facts repeated across sessions (collapsed to
one) still leave `limit` distinct ones."""
MAX_FETCH: Final = 200


class Memories:
    def __init__(self, embedder: Embedder, store: MemoryStore) -> None:
        self.embedder = embedder
        self.store = store

    async def upsert(self, records: list[MemoryRecord]) -> None:
        """Embed and store `records` (one embedder call); nothing is stored if a vector is
        not of the store's size."""
        if not records:
            return
        vectors = await self.embed([r.text for r in records])
        await self.store.upsert(records, vectors)

    async def search(
        self, query: str, match: Match, limit: int, min_score: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        if not query.strip():
            return []
        (vector,) = await self.embed([query])
        fetch = min(limit * OVERFETCH, MAX_FETCH)
        return distinct(await self.store.search(vector, match, fetch, min_score), limit)

    async def scroll(
        self,
        scope: StorageScope,
        session_id: str | None,
        limit: int,
        cursor: str | None,
        *,
        retired: bool = False,
    ) -> tuple[list[MemoryRecord], str | None]:
        match = scope.owner()
        if session_id is not None:
            match["session_id"] = session_id
        if cursor is not None and not _is_uuid(cursor):
            raise BadRequest(f"cursor {cursor[:64]!r} is not one this service gave out")
        return await self.store.scroll(match, limit, cursor, retired=retired)

    async def nearest(
        self, scope: StorageScope, texts: list[str], limit: int
    ) -> list[MemoryRecord]:
        """The user's active memories closest to `texts` (every session and agent of the
        user in this application), with no threshold: what new facts are reconciled with."""
        found = await self.search("\n".join(texts), scope.match_filter(["user_id"]), limit)
        return [record for record, _ in found]

    async def applied(self, scope: StorageScope, write_id: str) -> bool:
        """Whether a write of the model policy already reached the store: a memory it made or
        retired names it."""
        owner = scope.owner()
        made = await self.store.count({**owner, "write_id": write_id}, retired=True)
        return (
            made > 0 or await self.store.count({**owner, "retired_by": write_id}, retired=True) > 0
        )

    async def forget_ids(self, scope: StorageScope, memory_ids: list[str]) -> int:
        # An id that is no UUID names no memory; the owner filter keeps others' ids inert.
        ids = [i for i in memory_ids if _is_uuid(i)]
        return await self.store.delete(scope.owner(), ids) if ids else 0

    async def forget_session(self, scope: StorageScope, session_id: str) -> int:
        return await self.store.delete({**scope.owner(), "session_id": session_id})

    async def forget_user(self, scope: StorageScope) -> int:
        """Every memory of the user in the tenant, every application: the right to be forgotten."""
        return await self.store.delete(scope.owner())

    async def count(self, scope: StorageScope) -> int:
        return await self.store.count(scope.owner())

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors = await self.embedder.embed(texts)
        for vector in vectors:
            if len(vector) != self.store.dimension:
                raise VectorSizeMismatch(
                    f"embedder {self.embedder.name}", self.store.dimension, len(vector)
                )
        if len(vectors) != len(texts):
            raise VectorSizeMismatch(f"embedder {self.embedder.name}", len(texts), len(vectors))
        return vectors


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
