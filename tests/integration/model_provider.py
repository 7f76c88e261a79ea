"""A loopback model provider speaking the OpenAI chat-completions wire format over real HTTP/1.1
(JSON errors, SSE streams in chunked encoding, `Retry-After`), so the router's production client
code path is what the tests run. Each request gets the next scripted `Reply`."""

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client as NATS

from runbus import ops, subjects
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    Content,
    ErrorInfo,
    ModelRequest,
    ModelResponse,
    TextContent,
    encode,
)
from runbus.messages.errors import ERROR_DECODER
from runbus_examples.models import default_routes
from runbus_model_router.backends import ModelBackend
from runbus_model_router.config import parse_config
from runbus_model_router.service import ModelRouterService
from tests.helpers import take_time

STATUS_TEXT = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 429: "Too Many Requests"}
LLAMACPP_CONTEXT_ERROR = {
    "error": {
        "code": 400,
        "message": "request (5012 tokens) exceeds the available context size (4096 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5012,
        "n_ctx": 4096,
    }
}
"""What a llama.cpp server answers (HTTP 400) to a prompt longer than its context."""


@dataclass
class Reply:
    """What the provider does with one request."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    """Stream events (`data: <json>`), followed by `data: [DONE]`."""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error: str = "provider error"
    """Message of the JSON error body when `status` is not 200."""
    body: dict[str, Any] | None = None
    """The whole JSON error body instead (a real provider's), when `status` is not 200."""
    whole: bool = False
    """Answer with one `chat.completion` JSON body built from `chunks`, not a stream."""
    delay: float = 0.0
    """Seconds before the response starts (a slow or hung provider)."""
    pause_after: int | None = None
    """Stop streaming after this many chunks until `resume` is set (or the client leaves)."""
    resume: asyncio.Event = field(default_factory=asyncio.Event)
    chunk_delay: float = 0.0
    """Seconds between chunks."""
    raw: list[str] = field(default_factory=list)
    """Extra `data:` payloads sent as they are, before the chunks (garbage, error events)."""


def chunk(
    *,
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    model: str = "loopback-1",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"}
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    delta.update(extra or {})
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def usage_chunk(prompt: int, completion: int, model: str = "loopback-1") -> dict[str, Any]:
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def text_reply(
    text: str, *, words_per_chunk: int = 1, usage: tuple[int, int] = (11, 7), **kwargs: Any
) -> Reply:
    words = text.split(" ")
    pieces = [
        " ".join(words[i : i + words_per_chunk]) + (" " if i + words_per_chunk < len(words) else "")
        for i in range(0, len(words), words_per_chunk)
    ]
    chunks = [chunk(content=p) for p in pieces]
    chunks.append(chunk(finish_reason="stop"))
    chunks.append(usage_chunk(*usage))
    return Reply(chunks=chunks, **kwargs)


def tool_reply(calls: list[tuple[str, str, str]], *, usage: tuple[int, int] = (20, 9)) -> Reply:
    """Parallel tool calls `(call_id, name, arguments JSON text)`, arguments split in two."""
    chunks = []
    for index, (call_id, name, arguments) in enumerate(calls):
        half = len(arguments) // 2
        chunks.append(
            chunk(
                tool_calls=[
                    {
                        "index": index,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments[:half]},
                    }
                ]
            )
        )
        chunks.append(
            chunk(tool_calls=[{"index": index, "function": {"arguments": arguments[half:]}}])
        )
    chunks.append(chunk(finish_reason="tool_calls"))
    chunks.append(usage_chunk(*usage))
    return Reply(chunks=chunks)


def completion(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The `chat.completion` a server answering at once would send for these chunks."""
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    calls: dict[int, dict[str, Any]] = {}
    finish = "stop"
    for c in chunks:
        for choice in c["choices"]:
            finish = choice["finish_reason"] or finish
            for call in choice["delta"].get("tool_calls") or []:
                whole = calls.setdefault(
                    call["index"], {"type": "function", "function": {"name": "", "arguments": ""}}
                )
                whole["id"] = call.get("id") or whole.get("id")
                whole["function"]["name"] += call["function"].get("name") or ""
                whole["function"]["arguments"] += call["function"].get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    usage = next((c["usage"] for c in chunks if c.get("usage")), None)
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "loopback-1",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def status_reply(status: int, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, headers=headers or {}, error=f"loopback says {status}")


class LoopbackProvider:
    """`POST /v1/chat/completions` on 127.0.0.1; replies come from `replies` in order, then
    `default` (a short text answer) for every request after them."""

    def __init__(self, name: str = "loopback", port: int = 0) -> None:
        """On `port` (0: any free one)."""
        self.name = name
        self.replies: deque[Reply] = deque()
        self.default: Callable[[], Reply] = lambda: text_reply("Hello from the loopback provider.")
        self.requests: list[dict[str, Any]] = []
        self.arrivals: list[float] = []
        """`time.monotonic()` of each request."""
        self._handlers: set[asyncio.Task[Any]] = set()
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        """Path and query of each chat-completions request."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.finished = 0
        self.disconnected = 0
        self.connections = 0
        self.client_left = asyncio.Event()
        self.first_chunk_sent = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for handler in list(self._handlers):
            handler.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self.connections += 1
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # `stop` ends a connection this way; finishing normally keeps asyncio's stream
            # callback from logging the cancelled task as an error.
            pass
        finally:
            writer.close()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if not lines[0].startswith("POST ") or "/chat/completions" not in lines[0]:
            await self._send_json(writer, 404, {"error": {"message": "not found"}}, {})
            return True
        self.requests.append(json.loads(body))
        self.paths.append(lines[0].split(" ")[1])
        self.arrivals.append(time.monotonic())
        self.headers.append(headers)
        reply = self.replies.popleft() if self.replies else self.default()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if reply.delay:
                await take_time(reply.delay)
            if reply.status != 200:
                error = reply.body or {
                    "error": {"message": reply.error, "type": "loopback", "code": None}
                }
                await self._send_json(writer, reply.status, error, reply.headers)
            elif reply.whole:
                await self._send_json(writer, 200, completion(reply.chunks), reply.headers)
            else:
                await self._stream(reader, writer, reply)
            self.finished += 1
        finally:
            self.in_flight -= 1
        return True

    async def _send_json(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> None:
        data = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(
            f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode()
            + data
        )
        await writer.drain()

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: Reply
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n"
        )
        payloads = [*reply.raw, *(json.dumps(c) for c in reply.chunks), "[DONE]"]
        for index, payload in enumerate(payloads):
            paused = reply.pause_after is not None and index == reply.pause_after
            if paused and not await self._wait_or_leave(reader, reply.resume):
                self.disconnected += 1
                self.client_left.set()
                return
            event = f"data: {payload}\n\n".encode()
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            if index == 0:
                self.first_chunk_sent.set()
            if reply.chunk_delay:
                await take_time(reply.chunk_delay)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    @staticmethod
    async def _wait_or_leave(reader: asyncio.StreamReader, resume: asyncio.Event) -> bool:
        """True when `resume` is set, False when the client closed the connection first."""
        resumed = asyncio.ensure_future(resume.wait())
        left = asyncio.ensure_future(reader.read(1))
        done, pending = await asyncio.wait({resumed, left}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await task
        return resumed in done


@asynccontextmanager
async def loopback(name: str = "loopback", port: int = 0) -> AsyncIterator[LoopbackProvider]:
    provider = LoopbackProvider(name, port)
    await provider.start()
    try:
        yield provider
    finally:
        await provider.stop()


@asynccontextmanager
async def router(
    url: str,
    routes: str = "",
    *,
    builtins: dict[str, ModelBackend] | None = None,
    **kwargs: Any,
) -> AsyncIterator[ModelRouterService]:
    """A model router replica on its own connection, with `routes` as its routes file."""
    nc = await nats.connect(url)
    service = ModelRouterService(
        nc, builtins or default_routes({}), config=parse_config(routes), **kwargs
    )
    await service.start()
    # nats-py writes a flush's PING ahead of SUBs still in its buffer, so the first PONG does not
    # prove the endpoints are subscribed; by the second, the buffer has gone out before it.
    await nc.flush()
    await nc.flush()
    try:
        yield service
    finally:
        await service.stop()
        await nc.drain()


def user(*contents: Content) -> ChatMessage:
    return ChatMessage(role="user", contents=list(contents))


def ask(text: str, *, route: str = "cheap", **fields: Any) -> ModelRequest:
    return ModelRequest(route=route, messages=[user(TextContent(text=text))], **fields)


CTX = RunContext(
    run_id="r-model", session_id="s1", agent="travel", props={"tenant": "acme", "user_id": "alice"}
)


async def complete(
    nc: NATS, request: ModelRequest, ctx: RunContext = CTX, timeout: float = 20.0
) -> ModelResponse | ErrorInfo:
    """One `model.complete` over the bus: the response, or the error reply's info."""
    reply = await nc.request(
        subjects.MODEL_COMPLETE, encode(request), headers=ctx.to_headers(), timeout=timeout
    )
    if reply.headers and reply.headers.get("rb-error"):
        return ERROR_DECODER.decode(reply.data).error
    return ops.MODEL_COMPLETE.decode_reply.decode(reply.data)


async def answer(nc: NATS, request: ModelRequest, ctx: RunContext = CTX) -> ModelResponse:
    result = await complete(nc, request, ctx)
    assert isinstance(result, ModelResponse), result
    return result


async def refusal(nc: NATS, request: ModelRequest, ctx: RunContext = CTX) -> ErrorInfo:
    result = await complete(nc, request, ctx)
    assert isinstance(result, ErrorInfo), result
    return result
