"""Errors of the history service."""

from runbus.errors import RunbusError, Unauthenticated


class HistoryError(RunbusError):
    """Base of history errors."""


class MissingIdentity(Unauthenticated):
    """A request reached history without the trusted tenant header the gateway sets."""

    def __init__(self) -> None:
        super().__init__("history needs the trusted rb-prop-tenant header; call via the gateway")


class MissingMessageId(HistoryError):
    code = "bad_request"

    def __init__(self, index: int) -> None:
        super().__init__(f"message {index} has no message_id; history stores each id once")
        self.index = index
