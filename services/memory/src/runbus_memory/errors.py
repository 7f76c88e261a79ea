"""Errors of the memory service."""

from runbus.errors import RunbusError, Unauthenticated


class MemoryError_(RunbusError):  # not `MemoryError`: that is a builtin
    """Base of memory errors."""


class MissingIdentity(Unauthenticated):
    def __init__(self, missing: str) -> None:
        super().__init__(f"memory needs the trusted rb-prop-{missing} header; call via the gateway")
        self.missing = missing


class VectorSizeMismatch(MemoryError_):
    """The collection on the server, or the shard on disk, was made for another embedder."""

    code = "vector_size_mismatch"

    def __init__(self, collection: str, existing: int, configured: int) -> None:
        super().__init__(
            f"memory store {collection!r} holds vectors of size {existing}, but the configured "
            f"embedder makes {configured}; use another collection or data dir, or re-embed"
        )
        self.collection = collection
        self.existing = existing
        self.configured = configured


class StoreNotConfigured(MemoryError_):
    """Neither a store, a Qdrant URL nor a data dir was given, so memories have nowhere to go."""

    def __init__(self) -> None:
        super().__init__("memory needs a store, a Qdrant URL (RUNBUS_QDRANT_URL) or a data dir")
