"""The store interface and what both adapters share. The qdrant-client adapter lives in
`qdrant.py`, imported only when a Qdrant server is configured (the client costs ~1 s and
~60 MiB to import)."""

from typing import Final, Protocol

from .core import Match, MemoryRecord

COLLECTION: Final = "runbus_memories"
EMBEDDER_KEY: Final = "runbus_embedder"
"""Collection metadata (edge: a file beside the shard) naming the embedder of its vectors."""
UNRECORDED_EMBEDDER: Final = "hashing"
"""What a store holding memories but naming no embedder was made by: the only embedder runbus
had before it recorded one."""
KEYWORD_FIELDS: Final = ("application_id", "user_id", "session_id", "agent_id")
"""Indexed besides `tenant`, which is the partition key (`is_tenant`)."""


class MemoryStore(Protocol):
    """What the service needs from a vector store. Both adapters pass one contract suite
    (tests/integration/test_memory_store_contract.py)."""

    kind: str
    """`edge` or `qdrant`, for stats."""
    dimension: int

    async def upsert(self, records: list[MemoryRecord], vectors: list[list[float]]) -> None: ...

    async def search(
        self, vector: list[float], match: Match, limit: int, min_score: float | None = None
    ) -> list[tuple[MemoryRecord, float]]:
        """At most `limit` active memories whose payload equals every `match` field, best
        first, none scoring below `min_score`."""
        ...

    async def scroll(
        self, match: Match, limit: int, cursor: str | None = None, *, retired: bool = False
    ) -> tuple[list[MemoryRecord], str | None]:
        """A page of the active memories matching `match` (`retired`: retired ones too) and
        the cursor of the next page."""
        ...

    async def delete(self, match: Match, memory_ids: list[str] | None = None) -> int:
        """Remove the memories matching `match` (and among `memory_ids`, if given), retired
        ones too; how many."""
        ...

    async def count(self, match: Match, *, retired: bool = False) -> int:
        """Active memories matching `match` (`retired`: retired ones too)."""
        ...

    async def close(self) -> None: ...
