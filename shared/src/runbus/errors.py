"""The runbus exception family: one base, one subclass per wire error code."""

from typing import Any, ClassVar

from .messages.errors import ErrorInfo


class RunbusError(Exception):
    """Base of every runbus error; `code` is what travels in the `rb-error` header."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(code=self.code, message=self.message, details=self.details)


class BadRequest(RunbusError):
    """The body could not be decoded or broke a constraint."""

    code = "bad_request"


class Unauthenticated(RunbusError):
    """No credential, or one the verifier does not know."""

    code = "unauthenticated"


class NotFound(RunbusError):
    """The thing does not exist for this caller (also said when it belongs to someone else)."""

    code = "not_found"


class UnknownAgent(NotFound):
    """No agent definition has that name."""

    code = "unknown_agent"


class DeadlineExceeded(RunbusError):
    """The run's deadline passed before this step could finish."""

    code = "deadline_exceeded"


class Unavailable(RunbusError):
    """No replica answered: the service is not running or did not reply in time."""

    code = "unavailable"


class ModelError(RunbusError):
    """The model backend failed or returned something unusable."""

    code = "model_error"


class InternalError(RunbusError):
    """A bug: the message is generic, the detail is in the service's log."""

    code = "internal"


class RemoteError(RunbusError):
    """An error reply from another service; keeps the remote code as it was."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details=details)
        self.remote_code = code

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(code=self.remote_code, message=self.message, details=self.details)

    def __str__(self) -> str:
        return f"{self.remote_code}: {self.message}"
