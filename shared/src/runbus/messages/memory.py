"""Memory service requests and replies (`runbus.memory.*`), the `memory_search` tool's spec.

Scopes are not in these bodies: tenant, user and application come from trusted `rb-prop-*`
headers (on `runbus.memory.manage.*`, from the `rb-auth` token the memory service verifies),
session and agent from `rb-session-id` / `rb-agent`. Bodies carry only what may be untrusted.
"""

from datetime import datetime
from typing import Annotated, Final, Literal

import msgspec

from ._base import Message, Record
from .chat import Source
from .model import ToolSpec

MemoryStatus = Literal["active", "superseded", "deleted"]
"""An active memory is recalled; a superseded or deleted one is kept for audit only."""

SearchScope = Literal["tenant", "user", "session", "agent"]
"""How wide a search looks: `user` = this tenant's user across all sessions (the default)."""

SCOPE_FIELDS: Final = ("tenant", "application_id", "user_id", "session_id", "agent_id")
"""Storage-scope fields a search can match on (`MemorySearch.match`). The tenant and the
application are partitions: every search, list and forget matches them, named or not."""

MAX_TEXT: Final = 8192
"""Characters in one memory, or in one search query, at most."""

MemoryText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]


class MemoryStore(Message, frozen=True, tag="memory.store"):
    texts: list[MemoryText]
    """Statements worth remembering, stored under the caller's full storage scope."""
    sources: list[Source] = []
    """The `source` stamp of each text's chat message, in the order of `texts` (empty: all
    `external`). A `chat_history` or `context_provider` text is refused: no memory of
    memories. Also the body of `runbus.memory.writes` (JetStream), with the run's headers."""


class MemoryStored(Message, frozen=True, tag="memory.stored"):
    memory_ids: list[str]
    """Ids of the stored memories, in input order."""


class MemorySearch(Message, frozen=True, tag="memory.search"):
    query: Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
    """Untrusted search text (often the user's last message)."""
    scope: SearchScope = "user"
    """Where to look, always inside the caller's tenant; `match` replaces it when set."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5
    """At most this many hits."""
    match: list[str] | None = None
    """Fields of the caller's storage scope a memory must share to be found (`SCOPE_FIELDS`),
    besides tenant and application, which always match. `[]` searches nothing (an agent
    without a search scope); an unknown name is refused, never ignored."""
    min_score: float | None = None
    """Hits scoring below this (cosine similarity, -1..1) are left out; None keeps all."""


class MemoryHit(Record, frozen=True):
    memory_id: str
    """Id of the memory."""
    text: str
    """What was remembered."""
    score: float
    """Similarity, higher is closer (1.0 in a listing, which does not rank)."""
    session_id: str
    """Session it was stored from."""
    created_at: datetime
    """When it was stored."""
    agent_id: str = ""
    """Agent it was stored through."""
    application_id: str = ""
    """Application it belongs to ("" for none)."""
    status: MemoryStatus = "active"
    """`active`, or retired by the model policy and kept for audit (only an audit listing,
    `memory.list` with `include_retired`, shows retired memories)."""
    superseded_by: str = ""
    """Id of the memory that replaced this one (`superseded`)."""
    retired_at: datetime | None = None
    """When it was superseded or deleted; None while active."""


class MemoryHits(Message, frozen=True, tag="memory.hits"):
    hits: list[MemoryHit]
    """Best first."""


class MemoryList(Message, frozen=True, tag="memory.list"):
    session_id: str | None = None
    """Only memories stored from this session of the caller."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    """At most this many memories per page."""
    cursor: str | None = None
    """`next_cursor` of the previous page; None starts at the beginning."""
    include_retired: bool = False
    """An audit read: also memories the model policy superseded or deleted (`status` says
    which), which recall and search never return."""


class MemoryListed(Message, frozen=True, tag="memory.listed"):
    memories: list[MemoryHit]
    """The caller's memories (every application's, in the caller's tenant), unranked."""
    next_cursor: str | None = None
    """Pass it back for the next page; None when this was the last one."""


class MemoryForget(Message, frozen=True, tag="memory.forget"):
    memory_ids: list[str] = []
    """Forget these memories of the caller (ids of others' memories forget nothing)."""
    session_id: str | None = None
    """Forget every memory the caller stored from this session."""
    everything: bool = False
    """Forget every memory of the caller: the right to be forgotten."""


class MemoryForgotten(Message, frozen=True, tag="memory.forgotten"):
    forgotten: int
    """Memories removed."""


class MemoryStats(Message, frozen=True, tag="memory.stats"):
    """Counts for the caller and what the service runs on."""


class MemoryStatistics(Message, frozen=True, tag="memory.statistics"):
    memories: int
    """Memories of the caller (every application's, in the caller's tenant)."""
    embedder: str
    """Embedding model, e.g. `all-MiniLM-L6-v2-int8`."""
    dimension: int
    """Vector size."""
    store: str
    """`edge` (embedded shard) or `qdrant` (a server)."""
    pending_writes: int = 0
    """Writes queued on `runbus.memory.writes` and not yet stored."""


MEMORY_SEARCH_TOOL_QUERY_MAX: Final = 500
"""Characters of a `memory_search` query the service reads; the rest is cut off."""

MEMORY_SEARCH_TOOL: Final = ToolSpec(
    name="memory_search",
    description=(
        "Search what you remember about the user from earlier conversations: preferences and "
        "facts they told you. Returns the closest memories, best first."
    ),
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What to look for, in a few words.",
                "minLength": 1,
                "maxLength": MEMORY_SEARCH_TOOL_QUERY_MAX,
            }
        },
        "required": ["query"],
        "additionalProperties": False,
    },
)
"""The on-demand retrieval tool. The memory service itself answers it on
`runbus.tools.memory_search.invoke`; the search scope, top-k and threshold come from trusted
`rb-prop-memory_*` headers, never from the model's arguments."""

MEMORY_SCOPE_PROP: Final = "memory_scope"
"""Trusted run property: the agent's search scope for `memory_search` — a `SearchScope` preset
(`user`) or a comma list of `SCOPE_FIELDS` (`user_id,agent_id`); default `user`."""
MEMORY_LIMIT_PROP: Final = "memory_limit"
"""Trusted run property: top-k of `memory_search` (default 5)."""
MEMORY_MIN_SCORE_PROP: Final = "memory_min_score"
"""Trusted run property: score threshold of `memory_search` (default none)."""
MEMORY_STORE_PROP: Final = "memory_store"
"""Trusted run property on a memory write: `model` asks the memory service to extract the
user's facts from the write's texts (the user's messages) with a model and reconcile them;
absent, the texts are the statements to store (the gateway's rules kept them)."""
MEMORY_STORE_ROUTE_PROP: Final = "memory_store_route"
"""Trusted run property: the model route of the `model` store policy's extraction call."""
APPLICATION_PROP: Final = "application_id"
"""Trusted run property: the application a memory belongs to, a partition inside the tenant."""
