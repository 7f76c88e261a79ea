"""Model backends behind one interface: a request in, text deltas out as they come, a final
assistant message. Each backend streams through the same `on_delta` path."""

from collections.abc import Awaitable, Callable
from typing import Protocol

from runbus.messages import ModelRequest, ModelResponse

OnDelta = Callable[[str], Awaitable[None]]


class ModelBackend(Protocol):
    name: str

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        """Answer `request`; call `on_delta` with each piece of text in order."""
        ...
