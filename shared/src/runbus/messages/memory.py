"""Memory service requests and replies (`runbus.memory.*`).

Scopes are not in these bodies: tenant and user come from trusted `rb-prop-*` headers, session
and agent from `rb-session-id` / `rb-agent`. Bodies carry only what may be untrusted text.
"""

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from ._base import Message, Record

SearchScope = Literal["tenant", "user", "session", "agent"]
"""How wide a search looks: `user` = this tenant's user across all sessions (the default)."""

MemoryText = Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]


class MemoryStore(Message, frozen=True, tag="memory.store"):
    texts: list[MemoryText]
    """Statements worth remembering, stored under the caller's full storage scope."""


class MemoryStored(Message, frozen=True, tag="memory.stored"):
    memory_ids: list[str]
    """Ids of the stored memories, in input order."""


class MemorySearch(Message, frozen=True, tag="memory.search"):
    query: Annotated[str, msgspec.Meta(max_length=8192)]
    """Untrusted search text (often the user's last message)."""
    scope: SearchScope = "user"
    """Where to look, always inside the caller's tenant."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 5
    """At most this many hits."""


class MemoryHit(Record, frozen=True):
    memory_id: str
    """Id of the memory."""
    text: str
    """What was remembered."""
    score: float
    """Similarity, higher is closer."""
    session_id: str
    """Session it was stored from."""
    created_at: datetime
    """When it was stored."""


class MemoryHits(Message, frozen=True, tag="memory.hits"):
    hits: list[MemoryHit]
    """Best first."""


MEMORY_STORE_DECODER = msgspec.json.Decoder(MemoryStore)
MEMORY_STORED_DECODER = msgspec.json.Decoder(MemoryStored)
MEMORY_SEARCH_DECODER = msgspec.json.Decoder(MemorySearch)
MEMORY_HITS_DECODER = msgspec.json.Decoder(MemoryHits)
