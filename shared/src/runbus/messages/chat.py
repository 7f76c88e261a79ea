"""The chat message, its roles and the source stamp that decides what history stores."""

from datetime import datetime
from typing import Literal

from ._base import Record
from .contents import Content, FunctionCallContent, FunctionResultContent, TextContent

Role = Literal["system", "user", "assistant", "tool"]

Source = Literal["external", "chat_history", "context_provider", "compaction"]
"""Where a message came from in this run: `external` (the caller or the model), `chat_history`
(loaded from history: never stored again), `context_provider` (memories, todo list: stored only
if the agent opts in), `compaction` (a summary the compactor produced)."""


class Usage(Record, frozen=True):
    input_tokens: int = 0
    """Tokens the model read."""
    output_tokens: int = 0
    """Tokens the model wrote."""
    cost: float = 0.0
    """Price of those tokens in the model router's configured currency (0 without prices)."""

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost=self.cost + other.cost,
        )


class ChatMessage(Record, frozen=True):
    role: Role
    """Who speaks: `system` is trusted; `user`, `assistant` and `tool` are not."""
    contents: list[Content]
    """Ordered content parts."""
    message_id: str = ""
    """Stable id; history stores each id once. The gateway sets the ids of a run's messages
    from the run id (`<run_id>:in0`, `<run_id>:m0`, …), replacing any a caller sent, so a
    redelivered run finds its own messages and stores nothing twice."""
    created_at: datetime | None = None
    """When the message was made (UTC)."""
    source: Source = "external"
    """Where the message came from in this run (see `Source`)."""

    @property
    def text(self) -> str:
        """All text parts joined: what a person would read."""
        return "".join(c.text for c in self.contents if isinstance(c, TextContent))

    @property
    def function_calls(self) -> list[FunctionCallContent]:
        return [c for c in self.contents if isinstance(c, FunctionCallContent)]

    @property
    def function_results(self) -> list[FunctionResultContent]:
        return [c for c in self.contents if isinstance(c, FunctionResultContent)]
