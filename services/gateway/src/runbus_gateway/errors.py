"""Errors of the gateway."""

from runbus.errors import BadRequest, RunbusError


class GatewayConfigError(RunbusError):
    """An agent definition or the token file is invalid (raised at start)."""


class AgentMismatch(BadRequest):
    def __init__(self, subject_agent: str, body_agent: str) -> None:
        super().__init__(
            f"request published for agent {subject_agent!r} names agent {body_agent!r}"
        )


class MaxIterationsExceeded(RunbusError):
    code = "max_iterations"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the model still asked for tools after {limit} iterations")
        self.limit = limit
