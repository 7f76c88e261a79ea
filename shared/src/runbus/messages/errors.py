"""Typed error bodies: the reply of a failed request and the error inside `run.failed`, and the
one list of error codes runbus sends."""

from typing import Any, Final, Literal, TypeGuard, get_args

import msgspec

from ._base import Message, Record

ErrorCode = Literal[
    # the request itself
    "bad_request",
    "unauthenticated",
    "forbidden",
    "not_found",
    "unknown_agent",
    "conflict",
    "message_too_large",
    "method_not_allowed",
    "too_large",
    # the run
    "session_busy",
    "cancelled",
    "deadline_exceeded",
    "max_iterations",
    "tool_errors",
    "tool_call_limit",
    "dead_lettered",
    "invalid_state",
    "program_error",
    "output_invalid",
    "output_blocked",
    "agent_call_depth",
    "agent_call_fan_out",
    # the bus and the model
    "unavailable",
    "internal",
    "model_error",
    "model_unavailable",
    "unknown_route",
    "unsupported_request",
    "budget_exceeded",
    "context_too_long",
    "invalid_tool_schema",
    "invalid_tool_arguments",
    # tools
    "tool_config",
    "unknown_tool",
    "invalid_arguments",
    # memory
    "not_storable",
    "unknown_scope_field",
    "vector_size_mismatch",
    "embedder_mismatch",
    "embedder_unavailable",
    "embedder_config",
]
"""Every error code a runbus service of this version sends. On the wire a code stays a `str`, so
a code a newer producer adds still decodes; compare through `known_code`."""

ERROR_CODES: Final[frozenset[str]] = frozenset(get_args(ErrorCode))


def is_error_code(code: str) -> TypeGuard[ErrorCode]:
    """True if `code` is one of this version's `ErrorCode`s."""
    return code in ERROR_CODES


def known_code(code: str) -> ErrorCode | None:
    """`code` as an `ErrorCode`, or None for one this version does not know."""
    return code if is_error_code(code) else None


class ErrorInfo(Record, frozen=True):
    code: str
    """Stable machine-readable code: an `ErrorCode` (`bad_request`, `not_found`, …), or one a
    newer producer added."""
    message: str
    """What went wrong, for a person."""
    details: dict[str, Any] = {}
    """Structured extras (the offending field, the limit, …)."""

    @property
    def known_code(self) -> ErrorCode | None:
        """`code` as an `ErrorCode`, or None for one this version does not know."""
        return known_code(self.code)


class ErrorReply(Message, frozen=True, tag="error"):
    """Body of any reply that carries the `rb-error` header."""

    error: ErrorInfo
    """The error."""


ERROR_DECODER = msgspec.json.Decoder(ErrorReply)
