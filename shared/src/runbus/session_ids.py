"""Session ids scoped to their owner: what an ingress derives from a field any client fills
freely (OpenAI `user`, A2A `contextId`) names a session only its caller can hold."""

import hashlib
import re
from typing import Final

from .messages._base import is_identifier

_TAG_CHARS: Final = 16
_SCOPED: Final = re.compile(rf"^u([0-9a-f]{{{_TAG_CHARS}}})_")
_MAX: Final = 128
"""The longest identifier (`messages._base.IDENTIFIER_PATTERN`)."""


def owner_tag(tenant: str, user_id: str) -> str:
    """The owner's mark in the session ids scoped to them."""
    digest = hashlib.sha256(f"{tenant}\x00{user_id}".encode()).hexdigest()
    return digest[:_TAG_CHARS]


def scoped(tenant: str, user_id: str, given: str) -> str:
    """The caller's own session for the id `given`: `u<tag>_<given>`, or `given` unchanged
    when it already is one of the caller's (a client sending back the id it was answered
    with). A `given` too long, or not an identifier, is replaced by its digest."""
    tag = owner_tag(tenant, user_id)
    if scope_of(given) == tag and is_identifier(given):
        return given
    prefix = f"u{tag}_"
    if len(prefix) + len(given) > _MAX or not is_identifier(given):
        given = hashlib.sha256(given.encode()).hexdigest()[:32]
    return prefix + given


def scope_of(session_id: str) -> str | None:
    """The owner tag of a scoped session id; None for any other id."""
    match = _SCOPED.match(session_id)
    return match.group(1) if match else None


def unscoped(session_id: str) -> str:
    """The id a client named for a scoped session (the digest, where it was replaced), as
    shown back to it; any other id unchanged. Only for a session the caller already holds."""
    match = _SCOPED.match(session_id)
    return session_id[match.end() :] if match else session_id


def foreign(session_id: str, tenant: str, user_id: str) -> bool:
    """Whether `session_id` is scoped to someone other than this owner (so theirs to hold)."""
    tag = scope_of(session_id)
    return tag is not None and tag != owner_tag(tenant, user_id)
