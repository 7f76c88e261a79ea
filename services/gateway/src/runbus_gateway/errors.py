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


class ToolErrorLimit(RunbusError):
    code = "tool_errors"

    def __init__(self, limit: int) -> None:
        super().__init__(f"every tool call failed in {limit} steps in a row")
        self.limit = limit


class RunCancelled(RunbusError):
    code = "cancelled"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled")


class InputTooLarge(BadRequest):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"run input is {size} bytes of text, over the {limit} byte limit",
            details={"size": size, "limit": limit},
        )


class DeadLettered(RunbusError):
    code = "dead_lettered"

    def __init__(self, deliveries: int, last_error: str) -> None:
        super().__init__(
            f"the run was attempted {deliveries} times without finishing; last error: {last_error}",
            details={"deliveries": deliveries},
        )


class DedupeKeyMismatch(BadRequest):
    """`Nats-Msg-Id` is JetStream's dedupe key for the run queue; it must be the run id, or a
    re-publish with another id would run the same run twice."""

    def __init__(self, msg_id: str, run_id: str) -> None:
        super().__init__(
            f"Nats-Msg-Id {msg_id[:128]!r} must equal the body's run_id {run_id!r}",
            details={"field": "Nats-Msg-Id"},
        )


class TooManyToolCalls(RunbusError):
    """A model reply asked for more tool calls than the agent allows in one step."""

    code = "tool_call_limit"

    def __init__(self, calls: int, limit: int) -> None:
        super().__init__(
            f"the model asked for {calls} tool calls in one reply; the agent allows {limit} "
            "(max_tool_calls in its definition)",
            details={"calls": calls, "limit": limit},
        )
        self.limit = limit


class OutputInvalid(RunbusError):
    """The final answer did not have the output format's shape, after the repair turn too."""

    code = "output_invalid"

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"the model's answer does not match the output format after one repair turn: {problem}",
            details={"problem": problem},
        )
        self.problem = problem


class OutputBlocked(RunbusError):
    """An output guardrail tripped on the answer; nothing of the answer was shown or stored."""

    code = "output_blocked"

    def __init__(self, guardrail: str, message: str) -> None:
        super().__init__(message, details={"guardrail": guardrail})
        self.guardrail = guardrail
