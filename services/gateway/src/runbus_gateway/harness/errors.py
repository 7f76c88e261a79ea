"""Errors of the harness; all are `RunbusError`s with a stable code. Configuration mistakes are
`runbus_gateway.errors.GatewayConfigError`, raised at start."""

from runbus.errors import NotFound, RunbusError


class StateConflict(RunbusError):
    """Other writers kept changing the session's state bag: the change could not be made."""

    code = "conflict"

    def __init__(self, key: str, attempts: int) -> None:
        super().__init__(
            f"state {key!r} of the session kept changing; gave up after {attempts} attempts",
            details={"key": key, "attempts": attempts},
        )
        self.key = key


class SessionGone(NotFound):
    """The session the run opened was deleted and made again under the same id since: its
    state bag is another session's now, which the run must not write."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r}", details={"session_id": session_id})


class StateInvalid(RunbusError):
    """A value in the session's state bag does not have the shape its owner stores."""

    code = "invalid_state"

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(
            f"state {key!r} of the session is not readable: {problem}", details={"key": key}
        )
        self.key = key


class ProgramError(RunbusError):
    """A program agent broke its contract (e.g. returned a message that is not the assistant's)."""

    code = "program_error"

    def __init__(self, program: str, problem: str) -> None:
        super().__init__(f"program agent {program!r}: {problem}", details={"program": program})
        self.program = program
