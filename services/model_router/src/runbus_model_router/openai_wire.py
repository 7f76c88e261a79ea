"""runbus messages ⇄ the OpenAI chat-completions wire format, without any I/O.

Outbound: every content type mapped (text, images and files as data URLs, audio as
`input_audio`, URIs, function calls and results, reasoning for the family that reads it back),
tool schemas, and a prompt the API accepts (each tool call answered, no orphan results).
Inbound: the few fields runbus reads of a streamed chunk or a whole completion, decoded by
msgspec straight from the bytes, assembled into one assistant message, usage and finish reason.
"""

import base64
import json
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

import msgspec

from runbus.messages import (
    ChatMessage,
    Content,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    TextContent,
    ToolSpec,
    UriContent,
    Usage,
    UsageContent,
)
from runbus.messages.model import FinishReason

from .features import is_audio, is_image
from .repair import ArgumentsError, parse_arguments

NOT_RUN: Final = "no result: the call was not run"
_AUDIO_FORMATS: Final = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3"}

Param = dict[str, Any]


def data_url(part: DataContent) -> str:
    return f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"


def _user_part(part: Content) -> Param | None:
    match part:
        case TextContent(text=text):
            return {"type": "text", "text": text}
        case DataContent() if is_image(part):
            return {"type": "image_url", "image_url": {"url": data_url(part)}}
        case DataContent(data=data, media_type=media_type) if is_audio(part):
            audio_format = _AUDIO_FORMATS.get(media_type, media_type.split("/", 1)[1])
            return {
                "type": "input_audio",
                "input_audio": {"data": base64.b64encode(data).decode(), "format": audio_format},
            }
        case DataContent(media_type=media_type):
            extension = media_type.rsplit("/", 1)[-1]
            return {
                "type": "file",
                "file": {"file_data": data_url(part), "filename": f"attachment.{extension}"},
            }
        case UriContent(uri=uri) if is_image(part):
            return {"type": "image_url", "image_url": {"url": uri}}
        case UriContent(uri=uri):
            return {"type": "text", "text": uri}
        case ReasoningContent() | UsageContent() | FunctionCallContent() | FunctionResultContent():
            return None  # not user content
        case _:
            assert_never(part)


def _plain(part: Content) -> str:
    """Text for a place that only takes text (system, assistant, tool messages)."""
    match part:
        case TextContent(text=text):
            return text
        case DataContent(media_type=media_type, data=data):
            return f"[{media_type} attachment, {len(data)} bytes]"
        case UriContent(uri=uri):
            return uri
        case ReasoningContent() | UsageContent() | FunctionCallContent() | FunctionResultContent():
            return ""  # reasoning, calls and results have their own places; usage none
        case _:
            assert_never(part)


def _result_text(result: FunctionResultContent) -> str:
    if result.error is not None:
        return f"Error: {result.error}"
    if isinstance(result.result, str):
        return result.result
    return json.dumps(result.result, ensure_ascii=False)


def to_openai_messages(
    messages: list[ChatMessage], *, reasoning_field: str | None = None
) -> list[Param]:
    """The prompt in chat-completions form. Reasoning goes back under `reasoning_field` (the
    router has already removed reasoning another family wrote); without one it is dropped."""
    out: list[Param] = []
    for message in messages:
        match message.role:
            case "system":
                out.append({"role": "system", "content": "".join(map(_plain, message.contents))})
            case "user":
                out.extend(_tool_messages(message.function_results))
                parts = [p for p in map(_user_part, message.contents) if p is not None]
                if parts:
                    only_text = all(p["type"] == "text" for p in parts)
                    content = "".join(p["text"] for p in parts) if only_text else parts
                    out.append({"role": "user", "content": content})
            case "assistant":
                if assistant := _assistant(message, reasoning_field):
                    out.append(assistant)
            case "tool":
                out.extend(_tool_messages(message.function_results))
                text = "".join(_plain(p) for p in message.contents)
                if text and not message.function_results:
                    out.append({"role": "user", "content": text})
            case _:
                assert_never(message.role)
    return _answer_every_call(out)


def _assistant(message: ChatMessage, reasoning_field: str | None) -> Param | None:
    text = "".join(_plain(p) for p in message.contents)
    calls = message.function_calls
    reasoning = "".join(p.text for p in message.contents if isinstance(p, ReasoningContent))
    if not text and not calls:
        return None
    param: Param = {"role": "assistant", "content": text or None}
    if calls:
        param["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in calls
        ]
    if reasoning_field and reasoning:
        param[reasoning_field] = reasoning
    return param


def _tool_messages(results: list[FunctionResultContent]) -> list[Param]:
    return [
        {"role": "tool", "tool_call_id": r.call_id, "content": _result_text(r)} for r in results
    ]


def _answer_every_call(messages: list[Param]) -> list[Param]:
    """The API refuses a tool call without a result right after it and a result without its
    call; compaction or a crashed run can leave either, so mend the prompt instead."""
    mended: list[Param] = []
    open_calls: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            if message["tool_call_id"] in open_calls:
                open_calls.remove(message["tool_call_id"])
                mended.append(message)
            continue
        mended.extend(
            {"role": "tool", "tool_call_id": call_id, "content": NOT_RUN} for call_id in open_calls
        )
        open_calls = [c["id"] for c in message.get("tool_calls", [])]
        mended.append(message)
    mended.extend(
        {"role": "tool", "tool_call_id": call_id, "content": NOT_RUN} for call_id in open_calls
    )
    return mended


def to_openai_tools(tools: list[ToolSpec]) -> list[Param]:
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
        for tool in tools
    ]


class WireFunction(msgspec.Struct):
    name: str | None = None
    arguments: str | dict[str, Any] | None = None
    """A JSON text; a few servers answer a whole completion with the object itself."""


class WireToolCall(msgspec.Struct):
    index: int | None = None
    """Which call a streamed fragment continues; absent in a whole completion's list."""
    id: str | None = None
    function: WireFunction | None = None


class WireMessage(msgspec.Struct):
    """A chunk's `delta`, or a whole completion's `message`."""

    content: str | None = None
    tool_calls: list[WireToolCall] | None = None
    reasoning_content: Any = None
    reasoning: Any = None
    """Where OpenAI-compatible servers (DeepSeek, vLLM, Ollama, OpenRouter) put reasoning; read
    only when it is text (a server may send null or an object there)."""


class WireChoice(msgspec.Struct):
    index: int = 0
    delta: WireMessage | None = None
    message: WireMessage | None = None
    finish_reason: str | None = None


class WireUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class WireChunk(msgspec.Struct):
    """One streamed `chat.completion.chunk`, or a whole `chat.completion`: only what runbus
    reads; every other field is skipped by the decoder without being built."""

    id: str | None = None
    model: str | None = None
    choices: list[WireChoice] | None = None
    usage: WireUsage | None = None
    error: Any = None
    """An error event inside the stream (`{"error": {"message": …}}`)."""


CHUNK_DECODER: Final = msgspec.json.Decoder(WireChunk)
REQUEST_ENCODER: Final = msgspec.json.Encoder()


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class Assembled:
    """The reply once the stream has ended."""

    contents: list[Content]
    finish_reason: FinishReason
    usage: Usage | None
    model: str
    response_id: str
    problems: dict[str, str]
    """call_id → why its arguments could not be read (the call is kept with `{}`)."""
    repaired: list[str]
    """call_ids whose arguments were repaired into an object."""


class StreamAssembler:
    """Feed it the chunks in order; it returns each text delta and builds the reply."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.model = ""
        self.response_id = ""

    def feed(self, chunk: WireChunk) -> str:
        self.model = chunk.model or self.model
        self.response_id = chunk.id or self.response_id
        if chunk.usage is not None:
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens or 0,
                output_tokens=chunk.usage.completion_tokens or 0,
            )
        delta_text = ""
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            if choice.finish_reason:
                self.finish = choice.finish_reason
            delta = choice.delta or choice.message
            if delta is None:
                continue
            if delta.content:
                delta_text += delta.content
            for piece in (delta.reasoning_content, delta.reasoning):
                if isinstance(piece, str):
                    self.reasoning.append(piece)
                    break
            for position, call in enumerate(delta.tool_calls or ()):
                index = position if call.index is None else call.index
                partial = self.calls.setdefault(index, _PartialCall())
                partial.call_id = call.id or partial.call_id
                if (function := call.function) is not None:
                    partial.name += function.name or ""
                    arguments = function.arguments
                    if isinstance(arguments, dict):
                        arguments = json.dumps(arguments)
                    partial.arguments.append(arguments or "")
        if delta_text:
            self.text.append(delta_text)
        return delta_text

    def result(self) -> Assembled:
        contents: list[Content] = []
        if self.reasoning:
            contents.append(ReasoningContent(text="".join(self.reasoning)))
        if self.text:
            contents.append(TextContent(text="".join(self.text)))
        problems: dict[str, str] = {}
        repaired: list[str] = []
        for index in sorted(self.calls):
            partial = self.calls[index]
            call_id = partial.call_id or f"call_{index}"
            raw = "".join(partial.arguments)
            try:
                arguments, was_repaired = parse_arguments(raw)
            except ArgumentsError as exc:
                arguments, was_repaired = {}, False
                problems[call_id] = f"{exc} in {raw[:200]!r}"
            if was_repaired:
                repaired.append(call_id)
            contents.append(
                FunctionCallContent(call_id=call_id, name=partial.name, arguments=arguments)
            )
        finish: FinishReason
        if self.calls:
            finish = "tool_calls"
        elif self.finish == "length":
            finish = "length"
        else:
            finish = "stop"  # also content_filter: the text so far is the answer
        return Assembled(
            contents=contents,
            finish_reason=finish,
            usage=self.usage,
            model=self.model,
            response_id=self.response_id,
            problems=problems,
            repaired=repaired,
        )
