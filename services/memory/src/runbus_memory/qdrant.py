"""The qdrant-client adapter: a Qdrant server, or `:memory:` in tests and benches."""

from qdrant_client import AsyncQdrantClient, models

from .core import RETIRED, Match, MemoryRecord
from .errors import EmbedderMismatch, VectorSizeMismatch
from .stores import COLLECTION, EMBEDDER_KEY, KEYWORD_FIELDS, UNRECORDED_EMBEDDER


class QdrantClientStore:
    """One collection per deployment, partitioned by tenant (an `is_tenant` keyword index)."""

    kind = "qdrant"

    def __init__(self, client: AsyncQdrantClient, dimension: int, collection: str = COLLECTION):
        self.client = client
        self.dimension = dimension
        self.collection = collection

    @classmethod
    async def open(
        cls,
        dimension: int,
        *,
        url: str | None = None,
        location: str | None = None,
        embedder: str | None = None,
    ) -> "QdrantClientStore":
        client = AsyncQdrantClient(url=url) if url else AsyncQdrantClient(location=location)
        try:
            return await cls.attach(client, dimension, embedder=embedder)
        except BaseException:
            await client.close()
            raise

    @classmethod
    async def attach(
        cls,
        client: AsyncQdrantClient,
        dimension: int,
        collection: str = COLLECTION,
        *,
        embedder: str | None = None,
    ) -> "QdrantClientStore":
        """Use the collection on an existing client, creating it if missing. `embedder` names
        the model of the vectors; a collection made by another one is refused."""
        store = cls(client, dimension, collection)
        await store._ensure_collection(embedder)
        return store

    async def _ensure_collection(self, embedder: str | None) -> None:
        if await self.client.collection_exists(self.collection):
            info = await self.client.get_collection(self.collection)
            params = info.config.params.vectors
            size = params.size if isinstance(params, models.VectorParams) else None
            recorded = (info.config.metadata or {}).get(EMBEDDER_KEY)
            if recorded is None and (info.points_count or 0) > 0:
                recorded = UNRECORDED_EMBEDDER
            # The model is named first: after a change of RUNBUS_EMBEDDER it says what to set.
            if embedder is not None and recorded not in (None, embedder):
                raise EmbedderMismatch(self.collection, str(recorded), embedder)
            if size != self.dimension:
                raise VectorSizeMismatch(self.collection, size or 0, self.dimension)
            if embedder is not None and recorded is None:
                await self.client.update_collection(
                    self.collection, metadata={EMBEDDER_KEY: embedder}
                )
            indexed = set(info.payload_schema)
        else:
            await self.client.create_collection(
                self.collection,
                vectors_config=models.VectorParams(
                    size=self.dimension, distance=models.Distance.COSINE
                ),
                metadata={EMBEDDER_KEY: embedder} if embedder else None,
            )
            indexed = set()
        # Memories stored before applications existed belong to no application.
        await self.client.set_payload(
            self.collection,
            payload={"application_id": ""},
            points=models.Filter(
                must=[models.IsEmptyCondition(is_empty=models.PayloadField(key="application_id"))]
            ),
        )
        if self.client.init_options.get("location") == ":memory:":
            return  # local mode ignores payload indexes and warns about them
        if "tenant" not in indexed:
            await self.client.create_payload_index(
                self.collection,
                "tenant",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            )
        for field in KEYWORD_FIELDS:
            if field not in indexed:
                await self.client.create_payload_index(
                    self.collection, field, models.PayloadSchemaType.KEYWORD
                )

    async def upsert(self, records: list[MemoryRecord], vectors: list[list[float]]) -> None:
        await self.client.upsert(
            self.collection,
            points=[
                models.PointStruct(id=r.memory_id, vector=v, payload=r.payload())
                for r, v in zip(records, vectors, strict=True)
            ],
        )

    async def search(
        self, vector: list[float], match: Match, limit: int, min_score: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        response = await self.client.query_points(
            self.collection,
            query=vector,
            query_filter=_filter(match, active=True),
            limit=limit,
            score_threshold=min_score,
            with_payload=True,
        )
        return [
            (MemoryRecord.from_payload(str(p.id), p.payload or {}), p.score)
            for p in response.points
        ]

    async def scroll(
        self, match: Match, limit: int, cursor: str | None = None, *, retired: bool = False
    ) -> tuple[list[MemoryRecord], str | None]:
        points, next_offset = await self.client.scroll(
            self.collection,
            scroll_filter=_filter(match, active=not retired),
            limit=limit,
            offset=cursor,
            with_payload=True,
        )
        records = [MemoryRecord.from_payload(str(p.id), p.payload or {}) for p in points]
        return records, None if next_offset is None else str(next_offset)

    async def delete(self, match: Match, memory_ids: list[str] | None = None) -> int:
        selector = _filter(match, memory_ids)
        doomed = await self.count_filter(selector)
        if doomed:
            await self.client.delete(self.collection, points_selector=selector, wait=True)
        return doomed

    async def count(self, match: Match, *, retired: bool = False) -> int:
        return await self.count_filter(_filter(match, active=not retired))

    async def count_filter(self, selector: models.Filter) -> int:
        result = await self.client.count(self.collection, count_filter=selector, exact=True)
        return result.count

    async def close(self) -> None:
        await self.client.close()


def _filter(
    match: Match, memory_ids: list[str] | None = None, *, active: bool = False
) -> models.Filter:
    """`match` (and `memory_ids`); `active`: leaving out memories retired for audit."""
    must: list[models.Condition] = [
        models.FieldCondition(key=k, match=models.MatchValue(value=v)) for k, v in match.items()
    ]
    if memory_ids is not None:
        must.append(models.HasIdCondition(has_id=list(memory_ids)))
    must_not: list[models.Condition] | None = None
    if active:
        retired = models.MatchAny(any=list(RETIRED))
        must_not = [models.FieldCondition(key="status", match=retired)]
    return models.Filter(must=must, must_not=must_not)
