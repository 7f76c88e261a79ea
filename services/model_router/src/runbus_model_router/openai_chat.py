"""The OpenAI-compatible backend: chat completions over HTTP, always streamed, so OpenAI, Azure
OpenAI, Ollama, vLLM, llama.cpp and LM Studio work by base URL.

The request is encoded and each streamed chunk decoded by msgspec into the few fields runbus
reads (`openai_wire`), over one aiohttp session per backend (`http_session`): the SDK's typed
layer, a pydantic model per chunk, cost more CPU per call than the rest of the router, and its
transport's pool more again with many calls in flight. Nothing is retried here: the router
retries, backs off and falls back itself, and needs every failure classified
(`errors.ProviderFailure` subclasses) to do so.
"""

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote, urlsplit

import aiohttp
import msgspec
import structlog
from multidict import CIMultiDict
from opentelemetry import trace
from yarl import URL

from runbus.errors import RunbusError
from runbus.messages import (
    ChatMessage,
    Content,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    OutputFormat,
    TextContent,
    ToolSpec,
)
from runbus.messages.model import FinishReason

from . import output_tool, structured_tools
from .backend_kit import estimate_usage
from .backends import OnDelta
from .config import BackendConfig, RouteConfigError
from .errors import BadToolArguments, ProviderUnavailable
from .http_session import env_proxy, open_session
from .middleware import RESPONSE_ID
from .openai_wire import (
    CHUNK_DECODER,
    REQUEST_ENCODER,
    Assembled,
    StreamAssembler,
    WireChunk,
    to_openai_messages,
    to_openai_tools,
)
from .provider_errors import classify_status, classify_stream_error
from .server_health import GATEWAY_DOWN, ServerHealth, problem_of, shown_url
from .sse import SSEDecoder

log = structlog.get_logger()

NO_KEY: Final = "not-needed"
"""Sent when the backend names no key: local servers ignore it (as the SDK always sent one)."""
OPENAI_URL: Final = "https://api.openai.com/v1"
DRAIN_SECONDS: Final = 0.1
"""How long the rest of a body is read after `[DONE]`, so its connection can be reused."""
USER_AGENT: Final = "runbus-model-router"


class OpenAIEndpoint:
    """One backend's HTTP side: the chat-completions URL of a model, the credential and extra
    headers, one connection pool (an aiohttp session, opened at the first call: it belongs to
    the event loop that makes the calls)."""

    def __init__(self, name: str, config: BackendConfig) -> None:
        key = NO_KEY
        if config.api_key_env:
            key = os.environ.get(config.api_key_env, "")
            if not key:
                raise RouteConfigError(
                    f"backends.{name}", f"api_key_env {config.api_key_env!r} is not set"
                )
        headers = {
            "accept": "application/json",
            "content-type": "application/json",
            "user-agent": USER_AGENT,
        }
        # As the SDK does, OpenAI's organization and project come from the environment.
        if organization := os.environ.get("OPENAI_ORG_ID"):
            headers["openai-organization"] = organization
        if project := os.environ.get("OPENAI_PROJECT_ID"):
            headers["openai-project"] = project
        self.azure = config.type == "azure"
        self.query: dict[str, str] = {}
        if self.azure:
            base = f"{(config.base_url or '').rstrip('/')}/openai"
            headers["api-key"] = key
            self.query["api-version"] = config.api_version or ""
        else:
            base = config.base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
            headers["authorization"] = f"Bearer {key}"
        self.base_url = base.rstrip("/") + "/"
        self.shown_url = shown_url(base.rstrip("/"))
        """The base URL as a log line or an error may show it (no credentials)."""
        self.proxy = env_proxy(self.base_url)
        for_request, self.proxy_headers = self.proxy.headers(self.base_url.startswith("https:"))
        merged = CIMultiDict({**headers, **for_request})
        merged.update(config.headers)  # by name, whatever its case: a backend's own win
        self.headers = merged
        self._session: aiohttp.ClientSession | None = None
        self.health: ServerHealth | None = None
        """This server's health, told of every call's outcome (when it is watched)."""

    @property
    def models_url(self) -> URL:
        """What the health probe asks (the model list: cheap, and every server has it)."""
        return URL(f"{self.base_url}models").update_query(self.query)

    def url(self, model: str) -> URL:
        """Where `model`'s chat completions go (Azure: the deployment named `model`), with
        the backend's query: built once, not per call."""
        if self.azure:
            url = f"{self.base_url}deployments/{quote(model, safe='')}/chat/completions"
        else:
            url = f"{self.base_url}chat/completions"
        return URL(url).update_query(self.query)

    def session(self) -> aiohttp.ClientSession:
        """The backend's session, opened at the first call (in the loop that makes them)."""
        if self._session is None:
            self._session = open_session()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def open_client(name: str, config: BackendConfig) -> OpenAIEndpoint:
    return OpenAIEndpoint(name, config)


def server_of(client: OpenAIEndpoint) -> tuple[str, int]:
    """`server.address` and `server.port` of the span."""
    url = urlsplit(client.base_url)
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


class OpenAIChatModel:
    """One model at one OpenAI-compatible endpoint."""

    name = "openai"

    def __init__(
        self,
        client: OpenAIEndpoint,
        *,
        model: str,
        config: BackendConfig,
        timeout: float,
        native_tools: bool = True,
        native_output: bool = True,
    ) -> None:
        self.client = client
        self.model = model
        self.config = config
        self.timeout = timeout
        self.native_tools = native_tools
        self.native_output = native_output
        self.url = client.url(model)
        # Waiting for a connection, connecting, and every read of the stream may each take
        # this long: a chunk resets it. The whole call has no limit of its own.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
        )

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(
                request.messages, reasoning_field=self.config.reasoning_field
            ),
            "stream": True,
        }
        if self.config.stream_usage:
            params["stream_options"] = {"include_usage": True}
        if request.tools:
            params["tools"] = to_openai_tools(request.tools)
            if self.config.parallel_tool_calls:
                params["parallel_tool_calls"] = True
        if request.max_output_tokens:
            params[self.config.max_tokens_param] = request.max_output_tokens
        if request.temperature is not None:
            params["temperature"] = request.temperature
        if request.top_p is not None:
            params["top_p"] = request.top_p
        if request.stop:
            params["stop"] = request.stop
        if request.seed is not None:
            params["seed"] = request.seed
        if request.response_format is not None:
            params["response_format"] = response_format(request.response_format)
        return params

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        if request.response_format is None or self.native_output:
            return await self._complete(request, on_delta)
        called = await self._complete(output_tool.offer(request), on_delta)
        response = output_tool.answer(request, called)
        if response is not called:
            # The answer came as a call's arguments: nothing of it has streamed yet.
            await on_delta(response.message.text)
        return response

    async def _complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        assembler = StreamAssembler()
        offered = request.tools
        # Without native tool calls the reply is JSON standing for an answer or a call: it is
        # read whole, and only an answer's text reaches the reader.
        structured = bool(offered) and not self.native_tools
        params = self._params(structured_tools.offer(request) if structured else request)
        if structured:
            # Tools offered as JSON take the field: the answer is then free text again.
            params["response_format"] = structured_tools.response_format(offered)
        try:
            await self._exchange(
                REQUEST_ENCODER.encode(params), assembler, None if structured else on_delta
            )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            problem = problem_of(exc)
            if self.client.health is not None:
                self.client.health.unreachable(problem)
            raise ProviderUnavailable(self._unanswered(problem)) from None
        except aiohttp.ServerTimeoutError:
            self._doubt()
            raise ProviderUnavailable(f"no answer within {self.timeout:g}s") from None
        except aiohttp.ClientError as exc:
            self._doubt()
            raise ProviderUnavailable(self._unanswered(str(exc) or type(exc).__name__)) from None
        except msgspec.DecodeError as exc:  # an event that is not a chunk
            raise ProviderUnavailable(f"unreadable stream: {exc}") from None
        except RunbusError:
            raise
        except Exception as exc:
            # Whatever else goes wrong is still this provider failing: the route's retries and
            # fallbacks handle it, and the run does not fail as `internal`.
            log.exception("provider_call_failed", model=self.model)
            raise ProviderUnavailable(f"unexpected {type(exc).__name__}: {exc}") from None
        reply = assembler.result()
        if reply.response_id:
            # The provider's completion id, on the `chat` span this call runs in.
            trace.get_current_span().set_attribute(RESPONSE_ID, reply.response_id)
        contents, finish_reason = reply.contents, reply.finish_reason
        if structured:
            contents, finish_reason = await _read_structured(reply, offered, on_delta)
        message = ChatMessage(role="assistant", contents=contents, created_at=datetime.now(UTC))
        usage = reply.usage or estimate_usage(request.messages, message)
        if reply.repaired:
            log.info("tool_arguments_repaired", model=self.model, call_ids=reply.repaired)
        if reply.problems:
            raise BadToolArguments(message, reply.problems, usage)
        return ModelResponse(
            message=message,
            model=reply.model or self.model,
            finish_reason=finish_reason,
            usage=usage,
        )

    def _unanswered(self, problem: str) -> str:
        # Name the server and where it is configured: the operator's next step.
        return (
            f"model server at {self.client.shown_url} (a backend's base_url in "
            f"RUNBUS_MODEL_ROUTES) does not answer: {problem}"
        )

    def _doubt(self) -> None:
        if self.client.health is not None:
            self.client.health.doubt()

    async def _exchange(
        self, body: bytes, assembler: StreamAssembler, on_delta: OnDelta | None
    ) -> None:
        """Send the request and feed `assembler` the reply. Leaving early (a cancel, an error)
        closes the response, and with it the connection the provider streams on."""
        async with self.client.session().post(
            self.url,
            data=body,
            headers=self.client.headers,
            proxy=self.client.proxy.url,
            proxy_headers=self.client.proxy_headers,
            timeout=self._timeout,
            allow_redirects=False,  # as the SDK: a redirect is an answer, not followed
        ) as response:
            if self.client.health is not None:
                # Any answer but a gateway's "the server behind me is gone" proves it is there.
                if response.status in GATEWAY_DOWN:
                    self.client.health.doubt()
                else:
                    self.client.health.answered()
            if not 200 <= response.status < 300:
                raise classify_status(
                    response.status,
                    response.headers,
                    await response.read(),
                    model=self.model,
                )
            if response.headers.get("content-type", "").startswith("application/json"):
                # A server that answered the whole completion at once.
                await self._feed(CHUNK_DECODER.decode(await response.read()), assembler, on_delta)
                return
            if await self._read_events(response.content.iter_any(), assembler, on_delta):
                await _drain(response.content)

    async def _read_events(
        self, pieces: AsyncIterator[bytes], assembler: StreamAssembler, on_delta: OnDelta | None
    ) -> bool:
        """Feed each event's chunk to `assembler`; True when `[DONE]` ended the stream."""
        events = SSEDecoder()
        async for piece in pieces:
            for data in events.feed(piece):
                if data.startswith(b"[DONE]"):
                    return True
                await self._feed(CHUNK_DECODER.decode(data), assembler, on_delta)
        for data in events.close():
            if not data.startswith(b"[DONE]"):
                await self._feed(CHUNK_DECODER.decode(data), assembler, on_delta)
        return False

    async def _feed(
        self, chunk: WireChunk, assembler: StreamAssembler, on_delta: OnDelta | None
    ) -> None:
        if chunk.error is not None:
            raise classify_stream_error(chunk.error, model=self.model)
        if (text := assembler.feed(chunk)) and on_delta is not None:
            await on_delta(text)


async def _drain(body: aiohttp.StreamReader) -> None:
    """Read what follows `[DONE]` (the end of the chunked body) for a short while, so the
    connection goes back to the pool: one whose body was not read to its end is closed."""
    if body.at_eof():
        return
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while await body.readany():
                pass
    except (TimeoutError, aiohttp.ClientError):
        pass


async def _read_structured(
    reply: Assembled, tools: list[ToolSpec], on_delta: OnDelta
) -> tuple[list[Content], FinishReason]:
    text = "".join(p.text for p in reply.contents if isinstance(p, TextContent))
    kept = [p for p in reply.contents if not isinstance(p, TextContent)]
    read = structured_tools.read_reply(text, tools)
    if any(isinstance(p, FunctionCallContent) for p in read):
        return [*kept, *read], "tool_calls"
    answer = "".join(p.text for p in read if isinstance(p, TextContent))
    if answer:
        await on_delta(answer)
    return [*kept, *read], reply.finish_reason


def response_format(output: OutputFormat) -> dict[str, Any]:
    """OpenAI's `response_format` for `output` (llama.cpp's server reads the same field and
    constrains decoding to the schema)."""
    if output.schema is None:
        return {"type": "json_object"}
    schema = {"name": output.name, "schema": output.schema, "strict": output.strict}
    return {"type": "json_schema", "json_schema": schema}
