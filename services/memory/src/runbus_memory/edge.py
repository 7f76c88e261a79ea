"""The embedded store: one qdrant-edge shard in a local directory, the default when no Qdrant
server is configured. Same payload, ids and scope filters as the qdrant-client adapter."""

import asyncio
import json
from pathlib import Path
from typing import Final

from qdrant_edge import (
    CountRequest,
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    HasIdCondition,
    IsEmptyCondition,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    PayloadSchemaType,
    Point,
    Query,
    QueryRequest,
    ScrollRequest,
    UpdateOperation,
)

from .core import RETIRED, Match, MemoryRecord
from .errors import EmbedderMismatch, VectorSizeMismatch
from .stores import EMBEDDER_KEY, KEYWORD_FIELDS, UNRECORDED_EMBEDDER

# The shard writes its config here on create; reading it lets a size mismatch be named before
# the engine refuses the load with an untyped `Exception`.
CONFIG_FILE: Final = "edge_config.json"
EMBEDDER_FILE: Final = "runbus_embedder.json"
"""Beside the shard: `{"runbus_embedder": <name>}`, the embedder of its vectors."""
# The unnamed vector: `EdgeVectorParams` alone configures it, `Point(vector=[...])` and
# `Query.Nearest(...)` without `using` address it.
VECTOR: Final = ""


class EdgeStore:
    """A qdrant-edge shard on disk with keyword indexes on the scope fields.

    The engine is synchronous, so every call runs in a worker thread. It also holds the GIL
    while it works, so the loop still pauses for the call itself: ~0.1-0.3 ms per filtered
    search, a few ms per flushed write, cheap at memory's rates. Writes are serialised so an
    upsert and its flush never interleave with another write or with `close`.
    """

    kind = "edge"

    def __init__(
        self, shard: EdgeShard, dimension: int, path: Path, *, flush_interval: float = 1.0
    ) -> None:
        self.shard = shard
        self.dimension = dimension
        self.path = path
        self.flush_interval = flush_interval
        self._write_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls,
        path: Path,
        dimension: int,
        *,
        embedder: str | None = None,
        flush_interval: float = 1.0,
    ) -> "EdgeStore":
        """Open the shard at `path`, creating it (and the directory) if there is none yet.

        `embedder` names the model of the vectors; a shard made by another one is refused.
        `flush_interval`: seconds an upsert may wait for its fsync; 0 flushes every write.
        """
        if embedder is not None:  # named first: after a change of RUNBUS_EMBEDDER, what to set
            recorded = await asyncio.to_thread(_marked_embedder, path)
            if recorded not in (None, embedder):
                raise EmbedderMismatch(str(path), str(recorded), embedder)
        shard = await asyncio.to_thread(_open_shard, path, dimension)
        try:
            if embedder is not None:
                await asyncio.to_thread(_check_embedder, shard, path, embedder)
        except BaseException:
            await asyncio.to_thread(shard.close)
            raise
        return cls(shard, dimension, path, flush_interval=flush_interval)

    async def upsert(self, records: list[MemoryRecord], vectors: list[list[float]]) -> None:
        points = [Point(r.memory_id, v, r.payload()) for r, v in zip(records, vectors, strict=True)]
        # The shard's WAL already survives a process crash; the flush (an fsync, 3-10 ms here,
        # holding the GIL) is what survives an OS crash. Coalescing flushes keeps that cost off
        # every write and bounds what an OS crash can lose to `flush_interval`.
        await self._update(UpdateOperation.upsert_points(points))

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.flush_interval)
        async with self._write_lock:
            await asyncio.to_thread(self.shard.flush)

    async def _update(self, operation: UpdateOperation) -> None:
        async with self._write_lock:
            await asyncio.to_thread(self.shard.update, operation)
            if self.flush_interval <= 0:
                await asyncio.to_thread(self.shard.flush)
                return
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.create_task(self._flush_later())

    async def search(
        self, vector: list[float], match: Match, limit: int, min_score: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest(vector),
            filter=_filter(match, active=True),
            score_threshold=min_score,
            with_payload=True,
        )
        found = await asyncio.to_thread(self.shard.query, request)
        return [(MemoryRecord.from_payload(str(p.id), p.payload or {}), p.score) for p in found]

    async def scroll(
        self, match: Match, limit: int, cursor: str | None = None, *, retired: bool = False
    ) -> tuple[list[MemoryRecord], str | None]:
        request = ScrollRequest(
            offset=cursor,
            limit=limit,
            filter=_filter(match, active=not retired),
            with_payload=True,
            with_vector=False,
        )
        points, next_offset = await asyncio.to_thread(self.shard.scroll, request)
        records = [MemoryRecord.from_payload(str(p.id), p.payload or {}) for p in points]
        return records, None if next_offset is None else str(next_offset)

    async def delete(self, match: Match, memory_ids: list[str] | None = None) -> int:
        selector = _filter(match, memory_ids)
        async with self._write_lock:
            doomed = await asyncio.to_thread(self.shard.count, CountRequest(filter=selector))
            if doomed:
                await asyncio.to_thread(
                    self.shard.update, UpdateOperation.delete_points_by_filter(selector)
                )
                # Forgetting is what a person asked for: it reaches the disk now.
                await asyncio.to_thread(self.shard.flush)
        return int(doomed)

    async def count(self, match: Match, *, retired: bool = False) -> int:
        selector = _filter(match, active=not retired)
        counted = await asyncio.to_thread(self.shard.count, CountRequest(filter=selector))
        return int(counted)

    async def close(self) -> None:
        if self._flush_task is not None and not self._flush_task.done():
            self._flush_task.cancel()
        async with self._write_lock:
            if self._closed:
                return
            self._closed = True
            await asyncio.to_thread(self.shard.flush)
            await asyncio.to_thread(self.shard.close)


def _open_shard(path: Path, dimension: int) -> EdgeShard:
    config = EdgeConfig(vectors=EdgeVectorParams(size=dimension, distance=Distance.Cosine))
    if (path / CONFIG_FILE).exists():
        existing = persisted_size(path)
        if existing is not None and existing != dimension:
            raise VectorSizeMismatch(str(path), existing, dimension)
        # Passing the config makes the engine check it against the segments on disk too.
        shard = EdgeShard.load(str(path), config)
    else:
        path.mkdir(parents=True, exist_ok=True)
        shard = EdgeShard.create(str(path), config)
    try:
        _ensure_indexes(shard)
    except Exception:
        # Release the WAL lock, or the next open in this process fails on it.
        shard.close()
        raise
    return shard


def _filter(match: Match, memory_ids: list[str] | None = None, *, active: bool = False) -> Filter:
    """`match` (and `memory_ids`); `active`: leaving out memories retired for audit."""
    must: list[FieldCondition | HasIdCondition] = [
        FieldCondition(key, match=MatchValue(value)) for key, value in match.items()
    ]
    if memory_ids is not None:
        must.append(HasIdCondition(set(memory_ids)))
    must_not = [FieldCondition("status", match=MatchAny(list(RETIRED)))] if active else None
    return Filter(must=must, must_not=must_not)  # type: ignore[arg-type]  # invariant list


def _marked_embedder(path: Path) -> str | None:
    """The embedder the marker beside the shard names, if there is one."""
    try:
        recorded = json.loads((path / EMBEDDER_FILE).read_text()).get(EMBEDDER_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return None if recorded is None else str(recorded)


def _check_embedder(shard: EdgeShard, path: Path, embedder: str) -> None:
    marker = path / EMBEDDER_FILE
    try:
        recorded = json.loads(marker.read_text()).get(EMBEDDER_KEY)
    except (OSError, ValueError, AttributeError):
        recorded = UNRECORDED_EMBEDDER if shard.info().points_count > 0 else None
    if recorded is not None and recorded != embedder:
        raise EmbedderMismatch(str(path), str(recorded), embedder)
    if recorded is None:
        marker.write_text(json.dumps({EMBEDDER_KEY: embedder}) + "\n")


def persisted_size(path: Path) -> int | None:
    """Vector size the shard was created with, or None when the file does not say."""
    try:
        persisted = json.loads((path / CONFIG_FILE).read_text())
        size = persisted["vectors"][VECTOR]["size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return size if isinstance(size, int) else None


def _ensure_indexes(shard: EdgeShard) -> None:
    """Keyword indexes on every scope field, so a filtered search reads an index instead of
    checking payloads point by point; `tenant` is the partition key."""
    indexed = shard.info().payload_schema
    if "tenant" not in indexed:
        shard.update(
            UpdateOperation.create_field_index("tenant", KeywordIndexParams(is_tenant=True))
        )
    for field in KEYWORD_FIELDS:
        if field not in indexed:
            shard.update(UpdateOperation.create_field_index(field, PayloadSchemaType.Keyword))
    # Memories stored before applications existed belong to no application.
    shard.update(
        UpdateOperation.set_payload_by_filter(
            Filter(must=[IsEmptyCondition("application_id")]), {"application_id": ""}
        )
    )
