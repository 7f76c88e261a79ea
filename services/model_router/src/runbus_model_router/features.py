"""What a request needs from a model (images, audio, tools, context) and the transformations the
router may apply before sending it: placeholders for media, dropped reasoning, tool-schema checks.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, assert_never

import msgspec

from runbus.messages import (
    ChatMessage,
    Content,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ModelRequest,
    ReasoningContent,
    TextContent,
    ToolSpec,
    UriContent,
    UsageContent,
)

from .errors import InvalidToolSchema

IMAGE_TOKENS: Final = 1000
"""Rough prompt tokens one image costs (providers range from ~85 to ~1500)."""
AUDIO_TOKENS_PER_KB: Final = 8
"""Rough prompt tokens per kilobyte of audio."""
TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_IMAGE_SUFFIXES: Final = (".png", ".jpg", ".jpeg", ".gif", ".webp")
_JSON: Final = msgspec.json.Encoder()


def is_image(part: Content) -> bool:
    match part:
        case DataContent(media_type=media_type):
            return media_type.startswith("image/")
        case UriContent(uri=uri, media_type=media_type):
            if media_type is not None:
                return media_type.startswith("image/")
            lowered = uri.lower()
            return lowered.startswith("data:image/") or lowered.endswith(_IMAGE_SUFFIXES)
        case TextContent() | ReasoningContent() | UsageContent():
            return False
        case FunctionCallContent() | FunctionResultContent():
            return False
        case _:
            assert_never(part)


def is_audio(part: Content) -> bool:
    match part:
        case DataContent(media_type=media_type):
            return media_type.startswith("audio/")
        case UriContent(media_type=media_type):
            return media_type is not None and media_type.startswith("audio/")
        case TextContent() | ReasoningContent() | UsageContent():
            return False
        case FunctionCallContent() | FunctionResultContent():
            return False
        case _:
            assert_never(part)


@dataclass(frozen=True)
class Features:
    """What the request asks of a model."""

    has_images: bool
    has_audio: bool
    has_reasoning: bool
    """Some message carries reasoning (which may have to be dropped for the target)."""
    needs_tools: bool
    tokens: int
    """Estimated prompt tokens, tool schemas included."""
    max_output_tokens: int

    def needs(self) -> list[str]:
        wanted = ["text"]
        if self.has_images:
            wanted.append("images")
        if self.has_audio:
            wanted.append("audio")
        if self.needs_tools:
            wanted.append("tools")
        wanted.append(f"{self.tokens + self.max_output_tokens} tokens of context")
        return wanted


def estimate_tokens(request: ModelRequest) -> int:
    """Bytes/4 for text and JSON, a flat rate for images: good enough to compare to a window."""
    return features_of(request).tokens


def features_of(request: ModelRequest) -> Features:
    """Everything routing needs to know about the request, in one pass over its parts."""
    tokens = 0
    images = audio = reasoning = False
    for message in request.messages:
        tokens += 4
        for part in message.contents:
            kind = type(part)
            if kind is TextContent or kind is ReasoningContent:
                tokens += len(part.text) // 4 + 1  # type: ignore[union-attr]
                reasoning = reasoning or kind is ReasoningContent
            elif is_image(part):
                images = True
                tokens += IMAGE_TOKENS
            elif is_audio(part):
                audio = True
                size = len(part.data) if isinstance(part, DataContent) else 0
                tokens += size // 1024 * AUDIO_TOKENS_PER_KB + 1
            elif isinstance(part, UriContent):
                tokens += len(part.uri) // 4 + 1
            else:
                tokens += len(_JSON.encode(part)) // 4 + 1
    for tool in request.tools:
        tokens += len(_JSON.encode(tool)) // 4 + 1
    return Features(
        has_images=images,
        has_audio=audio,
        has_reasoning=reasoning,
        needs_tools=bool(request.tools),
        tokens=tokens,
        max_output_tokens=request.max_output_tokens or 0,
    )


def _describe(part: DataContent | UriContent, kind: str) -> str:
    match part:
        case DataContent(data=data, media_type=media_type):
            return (
                f"[{kind} omitted: {media_type}, {len(data)} bytes; this model cannot take {kind}s]"
            )
        case UriContent(uri=uri):
            shown = uri if not uri.startswith("data:") else uri.split(",", 1)[0] + ",…"
            return f"[{kind} omitted: {shown}; this model cannot take {kind}s]"
        case _:
            assert_never(part)


def with_placeholders(request: ModelRequest, *, images: bool, audio: bool) -> ModelRequest:
    """The request with each image (if `images`) and audio part (if `audio`) replaced by a
    text part naming what was left out, so the model knows something was there."""

    def swap(part: Content) -> Content:
        if images and isinstance(part, DataContent | UriContent) and is_image(part):
            return TextContent(text=_describe(part, "image"))
        if audio and isinstance(part, DataContent | UriContent) and is_audio(part):
            return TextContent(text=_describe(part, "audio"))
        return part

    return _map_parts(request, swap)


def without_reasoning(request: ModelRequest, keep: Callable[[ChatMessage], bool]) -> ModelRequest:
    """The request with reasoning parts removed from every message `keep` says no to."""

    def strip(message: ChatMessage) -> ChatMessage:
        if keep(message) or not any(isinstance(p, ReasoningContent) for p in message.contents):
            return message
        contents = [p for p in message.contents if not isinstance(p, ReasoningContent)]
        return msgspec.structs.replace(message, contents=contents)

    messages = [strip(m) for m in request.messages]
    if all(a is b for a, b in zip(messages, request.messages, strict=True)):
        return request
    return msgspec.structs.replace(request, messages=messages)


def _map_parts(request: ModelRequest, swap: Callable[[Content], Content]) -> ModelRequest:
    messages = []
    changed = False
    for message in request.messages:
        contents = [swap(p) for p in message.contents]
        if any(a is not b for a, b in zip(contents, message.contents, strict=True)):
            changed = True
            message = msgspec.structs.replace(message, contents=contents)
        messages.append(message)
    return msgspec.structs.replace(request, messages=messages) if changed else request


def check_tools(tools: list[ToolSpec]) -> None:
    """Refuse a tool list a provider would reject, naming the tool and the problem."""
    seen: set[str] = set()
    for tool in tools:
        if not TOOL_NAME.match(tool.name):
            raise InvalidToolSchema(tool.name, "name must be 1-64 letters, digits, '_' or '-'")
        if tool.name in seen:
            raise InvalidToolSchema(tool.name, "offered twice")
        seen.add(tool.name)
        _check_schema(tool.name, tool.parameters)


def _check_schema(name: str, schema: dict[str, Any]) -> None:
    kind = schema.get("type", "object")
    if kind != "object":
        raise InvalidToolSchema(name, f"parameters must be an object schema, not {kind!r}")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise InvalidToolSchema(name, "'properties' must be an object")
    for field, sub in properties.items():
        if not isinstance(sub, dict):
            raise InvalidToolSchema(name, f"property {field!r} must be a schema object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidToolSchema(name, "'required' must be a list of property names")
    missing = [r for r in required if r not in properties]
    if missing:
        raise InvalidToolSchema(name, f"required {missing!r} not among the properties")
