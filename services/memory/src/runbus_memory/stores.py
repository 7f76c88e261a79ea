"""The store interface and the qdrant-client adapter (a Qdrant server, or `:memory:`)."""

from typing import Final, Protocol

from qdrant_client import AsyncQdrantClient, models

from .core import MemoryRecord
from .errors import VectorSizeMismatch

COLLECTION: Final = "runbus_memories"
KEYWORD_FIELDS: Final = ("user_id", "session_id", "agent_id")


class MemoryStore(Protocol):
    """What the service needs from a vector store. Both adapters pass one contract suite
    (tests/integration/test_memory_store_contract.py)."""

    async def upsert(self, records: list[MemoryRecord], vectors: list[list[float]]) -> None: ...

    async def search(
        self, vector: list[float], match: dict[str, str], limit: int
    ) -> list[tuple[MemoryRecord, float]]:
        """At most `limit` memories whose payload equals every `match` field, best first."""
        ...

    async def close(self) -> None: ...


class QdrantClientStore:
    """One collection per deployment, partitioned by tenant (an `is_tenant` keyword index)."""

    def __init__(self, client: AsyncQdrantClient, dimension: int, collection: str = COLLECTION):
        self.client = client
        self.dimension = dimension
        self.collection = collection

    @classmethod
    async def open(
        cls, dimension: int, *, url: str | None = None, location: str | None = None
    ) -> "QdrantClientStore":
        client = AsyncQdrantClient(url=url) if url else AsyncQdrantClient(location=location)
        return await cls.attach(client, dimension)

    @classmethod
    async def attach(
        cls, client: AsyncQdrantClient, dimension: int, collection: str = COLLECTION
    ) -> "QdrantClientStore":
        """Use the collection on an existing client, creating it if missing."""
        store = cls(client, dimension, collection)
        await store._ensure_collection()
        return store

    async def _ensure_collection(self) -> None:
        if await self.client.collection_exists(self.collection):
            info = await self.client.get_collection(self.collection)
            params = info.config.params.vectors
            size = params.size if isinstance(params, models.VectorParams) else None
            if size != self.dimension:
                raise VectorSizeMismatch(self.collection, size or 0, self.dimension)
            return
        await self.client.create_collection(
            self.collection,
            vectors_config=models.VectorParams(
                size=self.dimension, distance=models.Distance.COSINE
            ),
        )
        if self.client.init_options.get("location") != ":memory:":
            await self.client.create_payload_index(
                self.collection,
                "tenant",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            )
            for field in KEYWORD_FIELDS:
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
        self, vector: list[float], match: dict[str, str], limit: int
    ) -> list[tuple[MemoryRecord, float]]:
        response = await self.client.query_points(
            self.collection,
            query=vector,
            query_filter=models.Filter(
                must=[
                    models.FieldCondition(key=k, match=models.MatchValue(value=v))
                    for k, v in match.items()
                ]
            ),
            limit=limit,
            with_payload=True,
        )
        return [
            (MemoryRecord.from_payload(str(p.id), p.payload or {}), p.score)
            for p in response.points
        ]

    async def close(self) -> None:
        await self.client.close()
