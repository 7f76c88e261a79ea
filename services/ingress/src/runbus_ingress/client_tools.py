"""The client's own tools (OpenAI `tools`, AG-UI frontend tools) as a request carries them.

No agent runs them yet, so a request that brings any is refused with a typed 400 naming the
agent and the field: a client must never get the agent's own answer as if its tools had been
offered (the old, silent behaviour)."""

from typing import ClassVar

from runbus.errors import RunbusError
from runbus.messages import ErrorCode


class ClientToolsRefused(RunbusError):
    """The request brings tools of the client's own, and the agent does not accept any."""

    code: ClassVar[ErrorCode] = "unsupported_request"

    def __init__(self, agent: str, field: str, names: list[str]) -> None:
        shown = ", ".join(repr(n[:64]) for n in names[:5]) + (", …" if len(names) > 5 else "")
        super().__init__(
            f"agent {agent[:128]!r} does not accept the client's own tools ({field}: {shown}); "
            f"it runs only its own tools: send the request without {field!r}",
            details={"param": field},
        )
        self.agent = agent
        self.field = field
        self.names = names


def refuse_client_tools(agent: str, field: str, names: list[str]) -> None:
    """Raise `ClientToolsRefused` when `names` (the request's client tools) is not empty."""
    if names:
        raise ClientToolsRefused(agent, field, names)
