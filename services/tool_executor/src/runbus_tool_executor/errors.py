"""Errors of the tool executor. Tool failures reach the model as results, not as these."""

from runbus.errors import NotFound, RunbusError


class ToolDefinitionError(RunbusError):
    """A tool function cannot be turned into a tool (raised at import, not per call)."""


class UnknownTool(NotFound):
    code = "unknown_tool"

    def __init__(self, name: str) -> None:
        super().__init__(f"no tool named {name!r} is served here")
        self.name = name
