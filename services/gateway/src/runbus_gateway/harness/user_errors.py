"""What a user reads when a run fails: the code is kept, the message is the agent's (its
`[harness] errors` table) unless runbus wrote it for the caller. A failure reaches here as a
typed error; the caller converts anything else it knows first (the service's boundary does)."""

from typing import Final

import msgspec

from runbus.errors import InternalError, RunbusError
from runbus.messages import ErrorInfo
from runbus.messages.errors import ErrorCode

SAFE_CODES: Final[frozenset[ErrorCode]] = frozenset(
    {
        "bad_request",
        "unauthenticated",
        "not_found",
        "unknown_agent",
        "session_busy",
        "message_too_large",
        "cancelled",
        "max_iterations",
        "tool_errors",
        "tool_call_limit",
        "deadline_exceeded",
        "dead_lettered",
        "conflict",
        "context_too_long",
        "output_invalid",  # names what the answer lacks of the asked shape
        "output_blocked",  # the guardrail's own message, written for users
    }
)
"""Codes whose messages runbus writes for the caller (they name the caller's own input or
limits); every other failure is shown with a generic message."""


class ErrorMessages(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a user reads when a run fails, per error code."""

    messages: dict[str, str] = {}
    """Text per error code (`model_error = "The assistant is busy, try again soon."`)."""
    default: str = "Something went wrong on our side. Please try again."
    """Text for any other code that is not in `SAFE_CODES`."""


def user_error(exc: BaseException, mapping: ErrorMessages | None = None) -> ErrorInfo:
    """The error a user is shown for `exc`: its code is kept, its message is replaced unless
    it is one runbus writes for the caller, and details go only with those. An exception that
    is no `RunbusError` is internal: its text never gets through."""
    mapping = mapping or ErrorMessages()
    error = exc if isinstance(exc, RunbusError) else InternalError(f"{type(exc).__name__}")
    info = error.to_info()
    if info.code in mapping.messages:
        return ErrorInfo(code=info.code, message=mapping.messages[info.code])
    if info.known_code in SAFE_CODES:
        return info
    return ErrorInfo(code=info.code, message=mapping.default)
