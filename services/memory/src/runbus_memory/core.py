"""Memory rules without a bus: storage scope from trusted headers, search filters that never
widen, normalised ids that store a fact once, input checks, and the `memory_search` tool's
scope forcing."""

import math
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from runbus.headers import RunContext
from runbus.messages.memory import (
    APPLICATION_PROP,
    MAX_TEXT,
    MEMORY_LIMIT_PROP,
    MEMORY_MIN_SCORE_PROP,
    MEMORY_SCOPE_PROP,
    MEMORY_SEARCH_TOOL_QUERY_MAX,
    SCOPE_FIELDS,
    MemoryForget,
    MemoryStatus,
    MemoryStore,
    SearchScope,
)

from .catalog import MINILM_NAME, USE_NAME
from .errors import (
    BadForget,
    BadTrustedProperty,
    EmptyText,
    MissingIdentity,
    NotStorable,
    SourcesMismatch,
    TextTooLong,
    TooManyTexts,
    UnknownScopeField,
)

_NAMESPACE = uuid.UUID("6f1c2a52-8f0e-4e57-9b1e-5b0f3c2d9a41")

MAX_TEXTS: Final = 64
"""Texts in one store request at most."""
PRESETS: Final[dict[str, list[str]]] = {
    "tenant": [],
    "user": ["user_id"],
    "session": ["user_id", "session_id"],
    "agent": ["user_id", "agent_id"],
}
"""Scope fields of each `SearchScope` preset, besides tenant and application."""
TOOL_DEFAULT_LIMIT: Final = 5
TOOL_MAX_LIMIT: Final = 20

Match = dict[str, str]
"""Payload fields a memory must equal to be found (a conjunction)."""


@dataclass(frozen=True)
class StorageScope:
    """What a memory belongs to. Taken from trusted headers only."""

    tenant: str
    user_id: str
    session_id: str
    agent_id: str
    application_id: str = ""
    """A partition inside the tenant; "" for memories of no particular application."""

    @classmethod
    def from_context(cls, ctx: RunContext) -> "StorageScope":
        for prop in ("tenant", "user_id"):
            if not ctx.prop(prop):
                raise MissingIdentity(prop)
        return cls(
            tenant=ctx.prop("tenant"),
            user_id=ctx.prop("user_id"),
            session_id=ctx.session_id,
            agent_id=ctx.agent,
            application_id=ctx.prop(APPLICATION_PROP),
        )

    def value(self, field: str) -> str:
        match field:
            case "tenant":
                return self.tenant
            case "application_id":
                return self.application_id
            case "user_id":
                return self.user_id
            case "session_id":
                return self.session_id
            case "agent_id":
                return self.agent_id
        raise UnknownScopeField(field, SCOPE_FIELDS)

    def owner(self) -> Match:
        """Every memory of the user in the tenant, across sessions, agents and applications:
        what the user lists, counts and can have forgotten."""
        return {"tenant": self.tenant, "user_id": self.user_id}

    def search_filter(self, scope: SearchScope) -> Match:
        """Payload fields a preset search must match; always inside the caller's partition."""
        return self.match_filter(PRESETS[scope])

    def match_filter(self, fields: list[str]) -> Match:
        """The caller's values of `fields`, plus tenant and application, which always match.

        An unknown field is refused: dropping it would search wider than was asked.
        """
        for field in fields:
            if field not in SCOPE_FIELDS:
                raise UnknownScopeField(field, SCOPE_FIELDS)
        named = {"tenant", "application_id", *fields}
        return {field: self.value(field) for field in SCOPE_FIELDS if field in named}


def search_match(
    scope: StorageScope, preset: SearchScope, fields: list[str] | None
) -> Match | None:
    """The filter of a search request: explicit `fields` win over the preset; `[]` is an agent
    without a search scope, which searches nothing (None)."""
    if fields is None:
        return scope.search_filter(preset)
    if not fields:
        return None
    return scope.match_filter(fields)


@dataclass(frozen=True)
class MemoryRecord:
    memory_id: str
    text: str
    scope: StorageScope
    created_at: datetime
    status: MemoryStatus = "active"
    """Only `active` memories are searched and recalled; retired ones are kept for audit."""
    write_id: str = ""
    """The write that made it under the model policy (its run), so a replay finds it."""
    superseded_by: str = ""
    """Id of the memory that replaced it (`superseded`)."""
    retired_at: datetime | None = None
    retired_by: str = ""
    """The write that retired it, so a replay of that write finds it was applied."""

    def payload(self) -> dict[str, str]:
        payload = {
            "text": self.text,
            "tenant": self.scope.tenant,
            "application_id": self.scope.application_id,
            "user_id": self.scope.user_id,
            "session_id": self.scope.session_id,
            "agent_id": self.scope.agent_id,
            "created_at": self.created_at.isoformat(),
            "status": self.status,
        }
        for key, value in (
            ("write_id", self.write_id),
            ("superseded_by", self.superseded_by),
            ("retired_at", self.retired_at.isoformat() if self.retired_at else ""),
            ("retired_by", self.retired_by),
        ):
            if value:
                payload[key] = value
        return payload

    @classmethod
    def from_payload(cls, memory_id: str, payload: dict[str, Any]) -> "MemoryRecord":
        retired_at = payload.get("retired_at")
        status = str(payload.get("status", "active"))
        return cls(
            memory_id=memory_id,
            text=str(payload["text"]),
            scope=StorageScope(
                tenant=str(payload["tenant"]),
                user_id=str(payload["user_id"]),
                session_id=str(payload.get("session_id", "")),
                agent_id=str(payload.get("agent_id", "")),
                application_id=str(payload.get("application_id", "")),
            ),
            created_at=datetime.fromisoformat(str(payload["created_at"])),
            status=status if status in RETIRED else "active",  # type: ignore[arg-type]
            write_id=str(payload.get("write_id", "")),
            superseded_by=str(payload.get("superseded_by", "")),
            retired_at=datetime.fromisoformat(str(retired_at)) if retired_at else None,
            retired_by=str(payload.get("retired_by", "")),
        )


RETIRED: Final = ("superseded", "deleted")
"""Statuses of memories kept for audit and never searched (memories stored before statuses
existed have none and are active)."""


def normalise(text: str) -> str:
    """The form two statements of one fact share: Unicode-normalised, case-folded, single
    spaces, no closing full stop or exclamation mark."""
    folded = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return folded.rstrip(" .!…")


def memory_id(scope: StorageScope, text: str) -> str:
    """Same fact, same storage scope → same id, so storing it again keeps one memory."""
    key = "\0".join(
        (
            scope.tenant,
            scope.application_id,
            scope.user_id,
            scope.session_id,
            scope.agent_id,
            normalise(text),
        )
    )
    return str(uuid.uuid5(_NAMESPACE, key))


def records_to_store(
    scope: StorageScope, request: MemoryStore, now: datetime | None = None
) -> list[MemoryRecord]:
    """The memories a store request makes, or the typed error that refuses all of it."""
    if len(request.texts) > MAX_TEXTS:
        raise TooManyTexts(len(request.texts), MAX_TEXTS)
    if request.sources and len(request.sources) != len(request.texts):
        raise SourcesMismatch(len(request.texts), len(request.sources))
    for index, source in enumerate(request.sources):
        if source != "external":
            raise NotStorable(index, source)
    texts = [t.strip() for t in request.texts]
    for index, text in enumerate(texts):
        if not text:
            raise EmptyText(index)
        if len(text) > MAX_TEXT:
            raise TextTooLong(f"texts[{index}]", len(text), MAX_TEXT)
    stamp = now or datetime.now(UTC)
    unique: dict[str, MemoryRecord] = {}
    for text in texts:
        record = MemoryRecord(memory_id(scope, text), text, scope, stamp)
        unique.setdefault(record.memory_id, record)
    return list(unique.values())


TIE: Final = 0.01
"""Scores this close rank as equal, and the newer memory comes first."""


def distinct(
    found: list[tuple[MemoryRecord, float]], limit: int
) -> list[tuple[MemoryRecord, float]]:
    """Best hit per fact, best first with recency as the tie-breaker: the same statement
    stored from several sessions is recalled once, and of two equally close memories the one
    the user said last comes first."""
    ranked = sorted(found, key=lambda hit: (-round(hit[1] / TIE), -hit[0].created_at.timestamp()))
    seen: set[str] = set()
    kept = []
    for record, score in ranked:
        key = normalise(record.text)
        if key not in seen:
            seen.add(key)
            kept.append((record, score))
    return kept[:limit]


RELEVANCE: Final[dict[str, float]] = {MINILM_NAME: 0.2, USE_NAME: 0.25}
"""A search with no `min_score` leaves out hits below its embedder's threshold, chosen on the
labelled evaluation set (`evaluation.choose_threshold` at top-5, `bench/memory_eval.py`): on its
English queries for MiniLM, on all six languages for USE. The `hashing` embedder matches words,
not meaning: the same rule gives it none."""


def relevance_threshold(embedder: str, min_score: float | None) -> float | None:
    """The threshold a search applies: the caller's, else the embedder's calibrated one."""
    return min_score if min_score is not None else RELEVANCE.get(embedder)


def forget_selector(request: MemoryForget) -> tuple[str, list[str] | str | None]:
    """Which of the three ways to forget a request asks for; exactly one must be given."""
    chosen = [
        ("ids", request.memory_ids) if request.memory_ids else None,
        ("session", request.session_id) if request.session_id else None,
        ("everything", None) if request.everything else None,
    ]
    given = [c for c in chosen if c is not None]
    if len(given) != 1:
        raise BadForget()
    return given[0]


@dataclass(frozen=True)
class ToolSearch:
    """A `memory_search` call as the service runs it: the model chose only `query`."""

    query: str
    match: Match
    limit: int
    min_score: float | None
    discarded: tuple[str, ...]
    """Arguments the model sent that are not the query (a scope, a user id): ignored."""


def tool_search(scope: StorageScope, ctx: RunContext, arguments: dict[str, Any]) -> ToolSearch:
    """Force the search scope, top-k and threshold from trusted properties; the model's query
    is cut to `MEMORY_SEARCH_TOOL_QUERY_MAX` characters. Raises `ValueError` with a message
    for the model when the query is missing or empty."""
    query = arguments.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError("`query` must be a non-empty string: what to look for")
    return ToolSearch(
        query=query.strip()[:MEMORY_SEARCH_TOOL_QUERY_MAX],
        match=_tool_match(scope, ctx.prop(MEMORY_SCOPE_PROP)),
        limit=_tool_limit(ctx.prop(MEMORY_LIMIT_PROP)),
        min_score=_tool_min_score(ctx.prop(MEMORY_MIN_SCORE_PROP)),
        discarded=tuple(sorted(k for k in arguments if k != "query")),
    )


def _tool_match(scope: StorageScope, raw: str) -> Match:
    value = raw.strip() or "user"
    if value in PRESETS:
        return scope.match_filter(PRESETS[value])
    fields = [f.strip() for f in value.split(",") if f.strip()]
    if not fields:
        raise BadTrustedProperty(MEMORY_SCOPE_PROP, raw, "a scope preset or field list")
    return scope.match_filter(fields)


def _tool_limit(raw: str) -> int:
    if not raw:
        return TOOL_DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise BadTrustedProperty(MEMORY_LIMIT_PROP, raw, "an integer") from None
    if not 1 <= limit <= TOOL_MAX_LIMIT:
        raise BadTrustedProperty(MEMORY_LIMIT_PROP, raw, f"between 1 and {TOOL_MAX_LIMIT}")
    return limit


def _tool_min_score(raw: str) -> float | None:
    if not raw:
        return None
    try:
        score = float(raw)
    except ValueError:
        raise BadTrustedProperty(MEMORY_MIN_SCORE_PROP, raw, "a number") from None
    if not math.isfinite(score):
        raise BadTrustedProperty(MEMORY_MIN_SCORE_PROP, raw, "a finite number")
    return score
