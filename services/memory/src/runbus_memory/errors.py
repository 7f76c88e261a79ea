"""Errors of the memory service."""

from runbus.errors import BadRequest, RunbusError, Unauthenticated, Unavailable


class MemoryError_(RunbusError):  # not `MemoryError`: that is a builtin
    """Base of memory errors."""


class MissingIdentity(MemoryError_, Unauthenticated):
    def __init__(self, missing: str) -> None:
        super().__init__(f"memory needs the trusted rb-prop-{missing} header; call via the gateway")
        self.missing = missing


class EmptyText(MemoryError_, BadRequest):
    """A text to store is empty once stripped."""

    def __init__(self, index: int) -> None:
        super().__init__(
            f"texts[{index}] is empty; there is nothing to remember",
            details={"field": f"texts[{index}]"},
        )
        self.index = index


class TextTooLong(MemoryError_, BadRequest):
    def __init__(self, field: str, length: int, limit: int) -> None:
        super().__init__(
            f"{field} has {length} characters, more than the {limit} a memory may have",
            details={"field": field, "limit": limit},
        )
        self.field = field
        self.length = length
        self.limit = limit


class TooManyTexts(MemoryError_, BadRequest):
    def __init__(self, count: int, limit: int) -> None:
        super().__init__(
            f"{count} texts in one store request, more than {limit}; split it",
            details={"field": "texts", "limit": limit},
        )
        self.count = count
        self.limit = limit


class SourcesMismatch(MemoryError_, BadRequest):
    def __init__(self, texts: int, sources: int) -> None:
        super().__init__(
            f"{sources} sources for {texts} texts; give one source per text, or none",
            details={"field": "sources"},
        )
        self.texts = texts
        self.sources = sources


class NotStorable(MemoryError_):
    """A text that is not the user's own words this run: no memory of memories."""

    code = "not_storable"

    def __init__(self, index: int, source: str) -> None:
        super().__init__(
            f"texts[{index}] has source {source!r}; only `external` texts are remembered "
            "(recalled memories, loaded history and summaries never are)",
            details={"field": f"sources[{index}]", "source": source},
        )
        self.index = index
        self.source = source


class UnknownScopeField(MemoryError_):
    """A search scope names a field memories are not stored under; ignoring it would
    widen the search, so the request is refused."""

    code = "unknown_scope_field"

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(
            f"unknown scope field {name!r}; known: {', '.join(known)}",
            details={"field": name, "known": list(known)},
        )
        self.name = name


class BadTrustedProperty(MemoryError_, BadRequest):
    """A `rb-prop-memory_*` value the gateway set cannot be read: a deployment bug."""

    def __init__(self, prop: str, value: str, expected: str) -> None:
        super().__init__(
            f"trusted property rb-prop-{prop}={value[:64]!r} is not {expected}",
            details={"property": prop},
        )
        self.prop = prop


class BadForget(MemoryError_, BadRequest):
    def __init__(self) -> None:
        super().__init__(
            "say what to forget: memory_ids, session_id, or everything=true (exactly one)",
            details={"field": "memory_ids"},
        )


class FindOutsideOwnScope(MemoryError_, BadRequest):
    """`memory.find` (clients) searches the caller's own memories and nothing wider."""

    def __init__(self) -> None:
        super().__init__(
            "memory.find searches only your own memories: scope `user`, no `match`",
            details={"field": "scope"},
        )


class VectorSizeMismatch(MemoryError_):
    """The collection on the server, or the shard on disk, was made for another embedder; or
    the embedder returned vectors of a size it did not announce."""

    code = "vector_size_mismatch"

    def __init__(self, collection: str, existing: int, configured: int) -> None:
        super().__init__(
            f"memory store {collection!r} holds vectors of size {existing}, but the configured "
            f"embedder makes {configured}; use another collection or data dir, or re-embed"
        )
        self.collection = collection
        self.existing = existing
        self.configured = configured


class EmbedderMismatch(MemoryError_):
    """The store holds vectors of another embedder: same size, other meaning. Mixing them
    would make every search quietly wrong."""

    code = "embedder_mismatch"

    def __init__(self, store: str, existing: str, configured: str) -> None:
        super().__init__(
            f"memory store {store!r} holds vectors made by embedder {existing!r}, but the "
            f"configured one is {configured!r}; set RUNBUS_EMBEDDER back, or use another data "
            "dir or collection"
        )
        self.store = store
        self.existing = existing
        self.configured = configured


class EmbedderUnavailable(MemoryError_, Unavailable):
    """The embeddings endpoint failed or answered something unusable."""

    code = "embedder_unavailable"

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"embeddings endpoint {url!r} failed: {reason}")
        self.url = url
        self.reason = reason


class EmbedderConfigError(MemoryError_):
    """The embedder cannot start: its model file is missing or corrupt, or a setting is bad."""

    code = "embedder_config"


class StoreNotConfigured(MemoryError_):
    """Neither a store, a Qdrant URL nor a data dir was given, so memories have nowhere to go."""

    def __init__(self) -> None:
        super().__init__("memory needs a store, a Qdrant URL (RUNBUS_QDRANT_URL) or a data dir")


class StoreUnreadable(MemoryError_):
    """A shard on disk cannot be opened as it is (its memories to be embedded again)."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"memory store {store!r} cannot be read: {reason}")
        self.store = store
        self.reason = reason
