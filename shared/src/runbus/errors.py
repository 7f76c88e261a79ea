"""The runbus exception family: one base, one subclass per wire error code."""

from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from . import headers as h
from .messages.errors import ERROR_DECODER, ErrorCode, ErrorInfo, known_code


class RunbusError(Exception):
    """Base of every runbus error; `code` is what travels in the `rb-error` header."""

    code: ClassVar[ErrorCode] = "internal"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, message=self.message, details=self.details)


class BadRequest(RunbusError):
    """The body could not be decoded or broke a constraint."""

    code: ClassVar[ErrorCode] = "bad_request"


class Unauthenticated(RunbusError):
    """No credential, or one the verifier does not know."""

    code: ClassVar[ErrorCode] = "unauthenticated"


class NotFound(RunbusError):
    """The thing does not exist for this caller (also said when it belongs to someone else)."""

    code: ClassVar[ErrorCode] = "not_found"


class Conflict(RunbusError):
    """The id is already in use by something that is not the caller's (e.g. a run id)."""

    code: ClassVar[ErrorCode] = "conflict"


class UnknownAgent(NotFound):
    """No agent definition has that name."""

    code: ClassVar[ErrorCode] = "unknown_agent"


class DeadlineExceeded(RunbusError):
    """The run's deadline passed before this step could finish."""

    code: ClassVar[ErrorCode] = "deadline_exceeded"


class Unavailable(RunbusError):
    """No replica answered: the service is not running or did not reply in time."""

    code: ClassVar[ErrorCode] = "unavailable"


class ModelError(RunbusError):
    """The model backend failed or returned something unusable."""

    code: ClassVar[ErrorCode] = "model_error"


class InternalError(RunbusError):
    """A bug: the message is generic, the detail is in the service's log."""

    code: ClassVar[ErrorCode] = "internal"


class RemoteError(RunbusError):
    """An error reply from another service; keeps the remote code as it was (`remote_code`),
    and as an `ErrorCode` to compare (`known_code`, None for one a newer service added)."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.remote_code = code
        self.known_code: ErrorCode | None = known_code(code)

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(code=self.remote_code, message=self.message, details=self.details)

    def __str__(self) -> str:
        return f"{self.remote_code}: {self.message}"


def remote_error(headers: Mapping[str, str] | None, data: bytes) -> RemoteError | None:
    """The error a reply carries (it has the `rb-error` header), or None for a normal reply.
    A body that does not decode still yields the header's code."""
    if not headers or h.ERROR not in headers:
        return None
    try:
        info = ERROR_DECODER.decode(data).error
    except msgspec.DecodeError:
        return RemoteError(headers[h.ERROR], "the error reply's body did not decode")
    return RemoteError(info.code, info.message, details=info.details)


class MessageTooLarge(BadRequest):
    """A message is larger than the NATS server accepts; checked before it is published."""

    code: ClassVar[ErrorCode] = "message_too_large"

    def __init__(self, subject: str, size: int, limit: int) -> None:
        super().__init__(
            f"a {size}-byte message for {subject!r} exceeds the bus limit of {limit} bytes "
            "(the NATS server's max_payload)",
            details={"subject": subject, "size": size, "limit": limit},
        )
        self.subject = subject
        self.size = size
        self.limit = limit


class IdleTimeout(Unavailable):
    """A progress-aware request heard nothing (no reply, no heartbeat) for its idle timeout:
    the serving replica died or stalled. Worth another try, like any unavailable service.
    `beats_stopped`: it had been heard beating and went silent for `idle` (`BEAT_SILENCE`),
    so it died, lost NATS or is stuck: not slow work, which keeps beating."""

    def __init__(
        self, subject: str, idle: float, setting: str, *, beats_stopped: bool = False
    ) -> None:
        message = (
            f"the replica serving {subject!r} stopped sending heartbeats {idle:g}s ago: it "
            "died, lost its NATS connection or is stuck"
            if beats_stopped
            else f"no progress on {subject!r} for {idle:g}s; raise {setting} if the work is "
            "slow but alive"
        )
        details: dict[str, Any] = {"subject": subject, "idle": idle, "setting": setting}
        if beats_stopped:
            details["beats_stopped"] = True
        super().__init__(message, details=details)
        self.subject = subject
        self.idle = idle
        self.setting = setting


class CallerGone(RunbusError):
    """The caller of a progress-aware request stopped listening (it gave up, was cancelled or
    died), so the work was cancelled; nobody reads this reply."""

    code: ClassVar[ErrorCode] = "cancelled"

    def __init__(self, subject: str) -> None:
        super().__init__(f"nobody listens on {subject!r} any more", details={"subject": subject})
        self.subject = subject
