"""Errors of the compaction service. A failed summary call is not one of these: it is reported in
the result and the prompt stays as it was."""

from runbus.errors import BadRequest


class EmptyPrompt(BadRequest):
    """There is nothing to compact: a model call needs at least one message."""

    def __init__(self) -> None:
        super().__init__("the prompt to compact has no messages", details={"field": "messages"})


class InvalidStrategy(BadRequest):
    """The strategy spec (or the legacy `max_tokens`) breaks a constraint."""

    def __init__(self, problem: str, *, field: str = "strategy") -> None:
        super().__init__(f"invalid compaction strategy: {problem}", details={"field": field})
        self.problem = problem
        self.field = field
