"""Errors of the tool executor. Tool failures reach the model as results, not as these."""

from runbus.errors import BadRequest, NotFound, RunbusError, Unavailable


class ToolDefinitionError(RunbusError):
    """A tool function cannot be turned into a tool (raised at import, not per call)."""


class ToolConfigError(ToolDefinitionError):
    """The deployment's tool config file is unreadable or names something that is not there."""

    code = "tool_config"

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"tool config {source}: {problem}")
        self.source = source
        self.problem = problem


class UnknownTool(NotFound):
    code = "unknown_tool"

    def __init__(self, name: str) -> None:
        super().__init__(f"no tool named {name!r} is served here")
        self.name = name


class InvalidArguments(BadRequest):
    """Arguments broke the tool's schema or escaped the tool root; becomes an error result."""

    code = "invalid_arguments"


class McpCallFailed(Unavailable):
    """An MCP server could not answer a tool call: not connected, the connection dropped, or
    it answered with something that is not MCP. Becomes an error result the model reads."""

    def __init__(self, server: str, problem: str) -> None:
        super().__init__(f"MCP server {server!r} {problem}")
        self.server = server
        self.problem = problem


class McpToolError(RunbusError):
    """The MCP tool ran and reported an error (`isError`); its text is the result's error."""
