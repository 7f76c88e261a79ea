"""The OpenAI Chat Completions shapes this ingress reads and writes (a subset, field for field
as OpenAI names them), plus the `runbus` extension field."""

from typing import Annotated, Any, Literal

import msgspec


class TextPart(msgspec.Struct, frozen=True, tag="text", tag_field="type"):
    text: str


class ChatInMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of `messages`; tool-call fields of replayed assistant turns are read past."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    """On a `tool` message: the call it answers (a call of the client's own tools)."""

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct, frozen=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    schema: dict[str, Any] | None = None
    """JSON Schema of the answer; None for any JSON object."""
    strict: bool | None = None
    description: str | None = None


class TextFormat(msgspec.Struct, frozen=True, tag="text", tag_field="type"):
    """Free text: the agent's own output format, if any."""


class JsonObjectFormat(msgspec.Struct, frozen=True, tag="json_object", tag_field="type"):
    """Any JSON object."""


class JsonSchemaResponseFormat(msgspec.Struct, frozen=True, tag="json_schema", tag_field="type"):
    json_schema: JsonSchemaFormat


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaResponseFormat
"""`response_format`: OpenAI's three kinds."""


class FunctionTool(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(msgspec.Struct, frozen=True, kw_only=True):
    """One of `tools`: a function of the client's own, for the model to call."""

    type: Literal["function"] = "function"
    function: FunctionTool


class ChatCompletionRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/chat/completions`; sampling options (`temperature`, …) are the agent's
    to decide and are ignored."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    """The runbus agent to run."""
    messages: Annotated[list[ChatInMessage], msgspec.Meta(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    """Used as the session id when no `Runbus-Session-Id` header or `metadata.session_id`."""
    metadata: dict[str, str] | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1
    response_format: ResponseFormat | None = None
    """The answer's shape for this run (the agent's own otherwise)."""
    tools: list[ChatTool] | None = None
    """The client's own tools, for an agent that takes them (`client_tools.py`); refused with
    a 400 by any other, never dropped."""


class ToolActivity(msgspec.Struct, frozen=True, kw_only=True):
    """A tool the agent ran server-side (the `runbus` extension; OpenAI clients ignore it)."""

    call_id: str
    name: str
    arguments: dict[str, Any] = {}
    result: Any = None
    error: str | None = None
    status: Literal["called", "waiting_approval", "done"] = "called"


class RunbusExtension(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """`runbus` on a completion (or a chunk): the run behind it and its tool activity."""

    run_id: str
    session_id: str = ""
    trace_id: str = ""
    tool_calls: list[ToolActivity] = []


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CalledFunction(msgspec.Struct, frozen=True):
    name: str
    arguments: str
    """The arguments as a JSON text, as OpenAI sends them."""


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A call of the client's own tools the run waits on; `id` comes back as the `tool`
    message's `tool_call_id`."""

    id: str
    function: CalledFunction
    type: Literal["function"] = "function"


class ToolCallDelta(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    id: str
    function: CalledFunction
    type: Literal["function"] = "function"


FinishReason = Literal["stop", "tool_calls"]


class AssistantMessage(msgspec.Struct, frozen=True):
    content: str | None
    role: Literal["assistant"] = "assistant"
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct, frozen=True):
    message: AssistantMessage
    index: int = 0
    finish_reason: FinishReason = "stop"
    logprobs: None = None


class ChatCompletion(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    runbus: RunbusExtension
    object: Literal["chat.completion"] = "chat.completion"


class Delta(msgspec.Struct, frozen=True, omit_defaults=True):
    content: str | None = None
    role: Literal["assistant"] | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, frozen=True):
    delta: Delta
    index: int = 0
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    runbus: RunbusExtension | None = None
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"


class Model(msgspec.Struct, frozen=True):
    id: str
    created: int = 0
    owned_by: str = "runbus"
    description: str = ""
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct, frozen=True):
    data: list[Model]
    object: Literal["list"] = "list"


CHAT_COMPLETION_REQUEST_DECODER = msgspec.json.Decoder(ChatCompletionRequest)
