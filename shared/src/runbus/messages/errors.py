"""Typed error bodies: the reply of a failed request and the error inside `run.failed`."""

from typing import Any

import msgspec

from ._base import Message, Record


class ErrorInfo(Record, frozen=True):
    code: str
    """Stable machine-readable code, e.g. `bad_request`, `unauthenticated`, `not_found`."""
    message: str
    """What went wrong, for a person."""
    details: dict[str, Any] = {}
    """Structured extras (the offending field, the limit, …)."""


class ErrorReply(Message, frozen=True, tag="error"):
    """Body of any reply that carries the `rb-error` header."""

    error: ErrorInfo
    """The error."""


ERROR_DECODER = msgspec.json.Decoder(ErrorReply)
