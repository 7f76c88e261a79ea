"""Errors of the history service."""

from runbus.errors import NotFound, RunbusError, Unauthenticated


class HistoryError(RunbusError):
    """Base of history errors."""


class MissingIdentity(Unauthenticated):
    """A request reached history without the trusted headers the gateway sets."""

    def __init__(self) -> None:
        super().__init__(
            "history needs the trusted rb-prop-tenant and rb-prop-user_id headers; call via "
            "the gateway"
        )


class SessionNotFound(NotFound):
    """Said both when the session does not exist and when it belongs to someone else."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r}")
        self.session_id = session_id


class SessionBusy(HistoryError):
    code = "session_busy"

    def __init__(self, session_id: str, active_run: str) -> None:
        super().__init__(
            f"session {session_id!r} is in use by run {active_run!r} (policy `reject`)",
            details={"active_run": active_run},
        )
        self.active_run = active_run


class RevisionConflict(HistoryError):
    code = "conflict"

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id!r} changed: expected revision {expected}, found {actual}",
            details={"expected_revision": expected, "revision": actual},
        )


class SessionExists(HistoryError):
    code = "conflict"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already exists; delete it before importing")


class ForeignDocument(HistoryError):
    code = "forbidden"

    def __init__(self) -> None:
        super().__init__("a session document can only be imported by its own tenant and owner")


class HistoryTooLarge(HistoryError):
    """What was asked for does not fit in one reply on this bus (its `max_payload`)."""

    code = "message_too_large"

    def __init__(self, session_id: str, what: str, remedy: str, *, size: int, limit: int) -> None:
        super().__init__(
            f"{what} of session {session_id!r} is more than one reply can carry on this bus "
            f"({size} bytes, limit {limit}): {remedy}",
            details={"session_id": session_id, "size": size, "limit": limit},
        )
        self.session_id = session_id
        self.size = size
        self.limit = limit
