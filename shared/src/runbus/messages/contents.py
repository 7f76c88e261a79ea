"""Content parts of a chat message: the tagged union every message family reuses."""

from typing import Any

from ._base import Message


class TextContent(Message, frozen=True, tag="text"):
    text: str
    """Plain text written by a user, the model or a context provider."""


class DataContent(Message, frozen=True, tag="data"):
    data: bytes
    """Raw bytes (base64 on the wire); large payloads go to the object store instead."""
    media_type: str
    """IANA media type of `data`, e.g. `image/png`."""


class UriContent(Message, frozen=True, tag="uri"):
    uri: str
    """Where the content lives (https://, data:, or an object-store reference)."""
    media_type: str | None = None
    """Media type if known."""


class FunctionCallContent(Message, frozen=True, tag="function_call"):
    call_id: str
    """Id the model gave this call; the matching result carries the same id."""
    name: str
    """Tool name as the model saw it."""
    arguments: dict[str, Any] = {}
    """Arguments chosen by the model: untrusted input."""


class FunctionResultContent(Message, frozen=True, tag="function_result"):
    call_id: str
    """Id of the function call this answers."""
    result: Any = None
    """JSON value the tool returned; absent when `error` is set."""
    error: str | None = None
    """Error text the model can read and correct; None on success."""


class ReasoningContent(Message, frozen=True, tag="reasoning"):
    text: str
    """The model's reasoning summary, if the provider exposes one."""


class UsageContent(Message, frozen=True, tag="usage"):
    input_tokens: int = 0
    """Tokens the model read."""
    output_tokens: int = 0
    """Tokens the model wrote."""


Content = (
    TextContent
    | DataContent
    | UriContent
    | FunctionCallContent
    | FunctionResultContent
    | ReasoningContent
    | UsageContent
)
