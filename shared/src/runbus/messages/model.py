"""Model router request and reply (`runbus.model.complete`)."""

from typing import Any, Literal

import msgspec

from ._base import Message, Record
from .chat import ChatMessage, Usage


class ToolSpec(Record, frozen=True):
    name: str
    """Name the model calls the tool by."""
    description: str
    """What the tool does, for the model."""
    parameters: dict[str, Any]
    """JSON Schema of the arguments the model may choose (injected ones are hidden)."""


class ModelRequest(Message, frozen=True, tag="model.complete"):
    route: str
    """Route or model to use, e.g. `offline`, `scripted/travel-3-tools`."""
    messages: list[ChatMessage]
    """The prompt, already compacted."""
    tools: list[ToolSpec] = []
    """Tools the model may call."""
    stream_to: str | None = None
    """Subject to publish `run.text_delta` events on while the model writes."""
    message_id: str = ""
    """Id the reply's assistant message gets; its text deltas carry the same id."""


FinishReason = Literal["stop", "tool_calls", "length"]


class ModelResponse(Message, frozen=True, tag="model.response"):
    message: ChatMessage
    """The assistant message (text and/or function calls)."""
    model: str
    """Model that answered."""
    finish_reason: FinishReason
    """Why the model stopped."""
    usage: Usage = Usage()
    """Tokens of this call."""


MODEL_REQUEST_DECODER = msgspec.json.Decoder(ModelRequest)
MODEL_RESPONSE_DECODER = msgspec.json.Decoder(ModelResponse)
