"""`POST /v1/responses`, a documented subset of OpenAI's Responses API: text input (a string or
user messages), `previous_response_id` to continue that response's session, whole or streamed
(`stream: true`, the Responses event sequence), no client-side tools. The response id is
`resp_<run_id>`; each assistant message of the run is one `message` output item."""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal, assert_never

import msgspec
import structlog
from aiohttp import web

from runbus import ops
from runbus.client import SequencedEvent
from runbus.errors import BadRequest, RunbusError, Unavailable
from runbus.messages import (
    ChatMessage,
    Content,
    ErrorInfo,
    OutputFormat,
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolProgress,
    RunToolResult,
    TextContent,
)
from runbus.messages.runs import RunGet

from . import openai_wire as oa
from . import sse
from .context import (
    RUN_ID_HEADER,
    checked_identifier,
    decode_body,
    ingress_of,
    json_response,
)
from .errors import error_response
from .openai_chat import SESSION_HEADER
from .openai_wire import TextPart

log = structlog.get_logger()

RESPONSE_PREFIX = "resp_"


class InputPart(msgspec.Struct, frozen=True, tag="input_text", tag_field="type"):
    text: str


class InputMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart | TextPart]
    type: Literal["message"] = "message"


class JsonSchemaTextFormat(msgspec.Struct, frozen=True, tag="json_schema", tag_field="type"):
    """`text.format` of the Responses API: the chat API's `json_schema`, flattened."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseText(msgspec.Struct, frozen=True, kw_only=True):
    format: oa.TextFormat | oa.JsonObjectFormat | JsonSchemaTextFormat | None = None


class ResponseRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/responses` (the subset runbus answers)."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    """The runbus agent to run."""
    input: Annotated[str, msgspec.Meta(min_length=1)] | list[InputMessage]
    previous_response_id: str | None = None
    """Continue that response's session."""
    stream: bool = False
    """Answer with the Responses API's server-sent events instead of one JSON response."""
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: ResponseText | None = None
    """`text.format`: the answer's shape for this run, as `response_format` on the chat API."""
    tools: list[dict[str, Any]] | None = None
    """The client's own tools: refused here (never dropped); `/v1/chat/completions` takes them."""


def _output_format(body: ResponseRequest) -> OutputFormat | None:
    match body.text.format if body.text else None:
        case JsonSchemaTextFormat(name=name, schema=schema, strict=strict):
            return OutputFormat(name=name, schema=schema, strict=strict is not False)
        case oa.JsonObjectFormat():
            return OutputFormat()
        case _:
            return None


_DECODER = msgspec.json.Decoder(ResponseRequest)


def _texts(body: ResponseRequest) -> list[str]:
    if isinstance(body.input, str):
        return [body.input]
    texts = []
    for message in body.input:
        if message.role != "user":
            continue  # the agent's instructions are its system prompt
        content = message.content
        texts.append(content if isinstance(content, str) else "".join(p.text for p in content))
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise BadRequest("`input` has no user text")
    return texts


class OutputMessage:
    """One assistant message of the run: a `message` output item with one `output_text` part."""

    def __init__(self, item_id: str, index: int) -> None:
        self.item_id = item_id
        self.index = index
        self.text = ""

    def item(self, status: Literal["in_progress", "completed"]) -> dict[str, Any]:
        content = [] if status == "in_progress" else [self.part()]
        return {
            "type": "message",
            "id": self.item_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": self.text, "annotations": []}


class Response:
    """The Responses API's view of one run: its output items as the run's events arrive, and
    the stream events (each with its `sequence_number`) they become."""

    def __init__(
        self, agent: str, run_id: str, session_id: str, metadata: dict[str, str] | None = None
    ) -> None:
        self.response_id = f"{RESPONSE_PREFIX}{run_id}"
        self.created = int(time.time())
        self.agent = agent
        self.run_id = run_id
        self.session_id = session_id
        self.metadata = metadata or {}
        self.output: list[OutputMessage] = []
        self.open: OutputMessage | None = None
        self.sequence = 0

    def body(
        self,
        status: Literal["in_progress", "completed", "failed"],
        *,
        done: RunCompleted | None = None,
        error: ErrorInfo | None = None,
    ) -> dict[str, Any]:
        """The `response` object in this state."""
        usage = None
        if done is not None:
            used = done.usage
            usage = {
                "input_tokens": used.input_tokens,
                "output_tokens": used.output_tokens,
                "total_tokens": used.input_tokens + used.output_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.agent,
            "output": [m.item("completed") for m in self.output if m is not self.open],
            "usage": usage,
            "error": None if error is None else {"code": error.code, "message": error.message},
            "incomplete_details": None,
            "instructions": None,
            "metadata": self.metadata,
            "parallel_tool_calls": False,
            "temperature": None,
            "tool_choice": "none",
            "tools": [],
            "top_p": None,
            "runbus": {"run_id": self.run_id, "session_id": self.session_id},
        }

    def whole(self, done: RunCompleted) -> dict[str, Any]:
        """The completed response of a run answered in one piece."""
        self._close()
        if not self.output:
            self._message(f"msg_{self.run_id}").text = done.text
        return self.body("completed", done=done)

    def opening(self) -> list[bytes]:
        """The events a stream starts with, before any of the run's."""
        return [
            self._frame("response.created", response=self.body("in_progress")),
            self._frame("response.in_progress", response=self.body("in_progress")),
        ]

    def frames(self, event: RunEvent) -> tuple[list[bytes], bool]:
        """The stream events `event` becomes, and whether the stream ends with them."""
        match event:
            case RunTextDelta(message_id=message_id, delta=delta):
                frames = []
                item_id = f"msg_{message_id}"
                if self.open is None or self.open.item_id != item_id:
                    frames += self._close()
                    frames += self._start(item_id)
                return frames + self._delta(delta), False
            case RunCompleted(text=text):
                frames = self._close()
                if not self.output and text:
                    # A model that does not stream: its whole answer is one delta.
                    frames += self._start(f"msg_{self.run_id}") + self._delta(text)
                    frames += self._close()
                done = self._frame(
                    "response.completed", response=self.body("completed", done=event)
                )
                return [*frames, done], True
            case RunFailed(error=error):
                frames = self._close()
                failed = self._frame("response.failed", response=self.body("failed", error=error))
                return [*frames, failed], True
            case RunToolCall() | RunToolResult() | RunApprovalRequested():
                # The agent's tools run server-side: a message before a tool call is finished.
                return self._close(), False
            case RunStarted() | RunCompacted() | RunPaused() | RunResumed() | RunToolProgress():
                return [], False
            case _:
                assert_never(event)

    def _message(self, item_id: str) -> OutputMessage:
        message = OutputMessage(item_id, len(self.output))
        self.output.append(message)
        return message

    def _start(self, item_id: str) -> list[bytes]:
        message = self.open = self._message(item_id)
        where = {"output_index": message.index}
        return [
            self._frame("response.output_item.added", item=message.item("in_progress"), **where),
            self._frame(
                "response.content_part.added",
                item_id=item_id,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
                **where,
            ),
        ]

    def _delta(self, delta: str) -> list[bytes]:
        message = self.open
        assert message is not None
        message.text += delta
        return [
            self._frame(
                "response.output_text.delta",
                item_id=message.item_id,
                output_index=message.index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        ]

    def _close(self) -> list[bytes]:
        message = self.open
        if message is None:
            return []
        self.open = None
        where = {"item_id": message.item_id, "output_index": message.index, "content_index": 0}
        return [
            self._frame("response.output_text.done", text=message.text, logprobs=[], **where),
            self._frame("response.content_part.done", part=message.part(), **where),
            self._frame(
                "response.output_item.done",
                output_index=message.index,
                item=message.item("completed"),
            ),
        ]

    def _frame(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse.data_frame(msgspec.json.encode(data), event=kind)


async def on_create_response(request: web.Request) -> web.StreamResponse:
    ingress = ingress_of(request)
    body = decode_body(await request.read(), _DECODER, "response")
    agent = checked_identifier(body.model, "model")
    if body.tools:
        raise BadRequest(
            "/v1/responses does not take the client's own tools yet: send them to "
            "/v1/chat/completions (`tools`), or send the request without 'tools'",
            details={"param": "tools"},
        )
    contents: list[Content] = [TextContent(text=t) for t in _texts(body)]
    message = ChatMessage(role="user", contents=contents)
    async with ingress.client(request) as client:
        session_id = request.headers.get(SESSION_HEADER) or (body.metadata or {}).get("session_id")
        if body.previous_response_id is not None:
            previous = body.previous_response_id.removeprefix(RESPONSE_PREFIX)
            checked_identifier(previous, "previous_response_id")
            info = await client.call(ops.API_RUNS_GET, RunGet(run_id=previous))
            session_id = info.record.session_id
        session_id = checked_identifier(session_id or f"s-{uuid.uuid4().hex[:16]}", "session id")
        run_id = f"r-{uuid.uuid4().hex[:16]}"
        headers = {RUN_ID_HEADER: run_id, SESSION_HEADER: session_id}
        response = Response(agent, run_id, session_id, body.metadata)
        await client.start_traced(
            agent,
            [message],
            session_id=session_id,
            run_id=run_id,
            output_format=_output_format(body),
        )
        async with aclosing(client.follow(run_id, timeout=ingress.idle_timeout)) as events:
            if not body.stream:
                return await _whole(response, events, headers)
            async with aclosing(sse.with_keepalives(events, ingress.keepalive)) as paced:
                # A run refused at once (unknown agent, bad input) is an HTTP error, as OpenAI
                # answers a bad request, not a stream that fails.
                first = await anext(paced)
                if first is not None and isinstance(first.event, RunFailed):
                    return error_response(first.event.error, headers=headers, openai=True)
                return await _stream(request, response, first, paced, headers)


async def _whole(
    response: Response, events: AsyncIterator[SequencedEvent], headers: dict[str, str]
) -> web.Response:
    async for item in events:
        match item.event:
            case RunCompleted() as done:
                return json_response(response.whole(done), headers=headers)
            case RunFailed(error=error):
                return error_response(error, headers=headers, openai=True)
            case (
                RunStarted()
                | RunApprovalRequested()
                | RunCompacted()
                | RunPaused()
                | RunResumed()
                | RunTextDelta()
                | RunToolCall()
                | RunToolResult()
                | RunToolProgress()
            ):
                pass  # the answer is the final event's text
            case _:
                assert_never(item.event)
    raise Unavailable("the event stream ended without a final event")


async def _stream(
    request: web.Request,
    response: Response,
    first: SequencedEvent | None,
    paced: AsyncIterator[SequencedEvent | None],
    headers: dict[str, str],
) -> web.StreamResponse:
    stream = await sse.open_stream(request, headers)
    try:
        for frame in response.opening():
            await stream.write(frame)
        item = first
        while True:
            if item is None:
                await stream.write(sse.KEEPALIVE)
            else:
                frames, done = response.frames(item.event)
                for frame in frames:
                    await stream.write(frame)
                if done:
                    break
            try:
                item = await anext(paced)
            except StopAsyncIteration:
                break
    except ConnectionResetError:
        log.info("responses_stream_closed", run_id=response.run_id)
    except asyncio.CancelledError:
        log.info("responses_stream_closed", run_id=response.run_id)
        raise
    except Exception as exc:
        # The status line is long gone: the Responses API's way is a `response.failed` event.
        log.exception("responses_stream_failed", run_id=response.run_id)
        info = (
            exc.to_info()
            if isinstance(exc, RunbusError)
            else ErrorInfo(code="internal", message="internal error")
        )
        frames, _ = response.frames(RunFailed(run_id=response.run_id, error=info))
        for frame in frames:
            await stream.write(frame)
    return stream
