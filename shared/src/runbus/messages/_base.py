"""Base Structs for every wire type, and the one JSON encoder they share."""

import re
from typing import Annotated, Final

import msgspec

# `\Z`, not `$`: Python's `$` also matches before a trailing newline, and "s1\n" is no token.
IDENTIFIER_PATTERN: Final = r"^[A-Za-z0-9_-]{1,128}\Z"
Identifier = Annotated[str, msgspec.Meta(pattern=IDENTIFIER_PATTERN)]
"""An id that is safe as one NATS subject token: letters, digits, `_` and `-`, at most 128."""

_IDENTIFIER: Final = re.compile(IDENTIFIER_PATTERN)


def is_identifier(value: str) -> bool:
    """True if `value` may stand as one subject token (see `Identifier`)."""
    return _IDENTIFIER.match(value) is not None


class Message(msgspec.Struct, kw_only=True, frozen=True, tag_field="type"):
    """A top-level wire message: a tagged Struct whose `type` names it on the wire."""


class Record(msgspec.Struct, kw_only=True, frozen=True):
    """A nested wire value with a fixed shape (no `type` tag)."""


ENCODER: Final = msgspec.json.Encoder()


def encode(message: msgspec.Struct | msgspec.Raw) -> bytes:
    """JSON bytes of any wire Struct (a `Raw` body is passed through as it is)."""
    return ENCODER.encode(message)
