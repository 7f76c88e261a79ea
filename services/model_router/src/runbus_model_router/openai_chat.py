"""The OpenAI-compatible backend: chat completions through the official `openai` SDK, always
streamed, so OpenAI, Azure OpenAI, Ollama, vLLM, llama.cpp and LM Studio work by base URL.

The SDK's own retries are off: the router retries, backs off and falls back itself, and needs
every failure classified (`errors.ProviderFailure` subclasses) to do so.
"""

import os
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import openai
import structlog
from openai import AsyncAzureOpenAI, AsyncOpenAI

from runbus.errors import RunbusError
from runbus.messages import (
    ChatMessage,
    Content,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    TextContent,
    ToolSpec,
)
from runbus.messages.model import FinishReason

from . import structured_tools
from ._common import estimate_usage
from .backends import OnDelta
from .config import BackendConfig, RouteConfigError
from .errors import (
    BadToolArguments,
    ProviderRejected,
    ProviderUnavailable,
    TargetMisconfigured,
)
from .openai_wire import Assembled, StreamAssembler, to_openai_messages, to_openai_tools

log = structlog.get_logger()

NO_KEY = "not-needed"
"""Sent when the backend names no key: local servers ignore it, the SDK insists on one."""


def open_client(name: str, config: BackendConfig) -> AsyncOpenAI:
    key = NO_KEY
    if config.api_key_env:
        key = os.environ.get(config.api_key_env, "")
        if not key:
            raise RouteConfigError(
                f"backends.{name}", f"api_key_env {config.api_key_env!r} is not set"
            )
    if config.type == "azure":
        return AsyncAzureOpenAI(
            api_key=key,
            azure_endpoint=config.base_url or "",
            api_version=config.api_version,
            max_retries=0,
            default_headers=config.headers or None,
        )
    return AsyncOpenAI(
        api_key=key,
        base_url=config.base_url,
        max_retries=0,
        default_headers=config.headers or None,
    )


def server_of(client: AsyncOpenAI) -> tuple[str, int]:
    """`server.address` and `server.port` of the span."""
    url = urlsplit(str(client.base_url))
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if sent."""
    if raw := headers.get("retry-after-ms"):
        try:
            return max(0.0, float(raw) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class OpenAIChatModel:
    """One model at one OpenAI-compatible endpoint."""

    name = "openai"

    def __init__(
        self,
        client: AsyncOpenAI,
        *,
        model: str,
        config: BackendConfig,
        timeout: float,
        native_tools: bool = True,
    ) -> None:
        self.client = client
        self.model = model
        self.config = config
        self.timeout = timeout
        self.native_tools = native_tools

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
        return params

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        assembler = StreamAssembler()
        offered = request.tools
        # Without native tool calls the reply is JSON standing for an answer or a call: it is
        # read whole, and only an answer's text reaches the reader.
        structured = bool(offered) and not self.native_tools
        params = self._params(structured_tools.offer(request) if structured else request)
        if structured:
            params["response_format"] = structured_tools.response_format(offered)
        try:
            stream = await self.client.chat.completions.create(**params, timeout=self.timeout)
            async with stream:
                async for chunk in stream:
                    if (text := assembler.feed(chunk)) and not structured:
                        await on_delta(text)
        except openai.APITimeoutError:
            raise ProviderUnavailable(f"no answer within {self.timeout:g}s") from None
        except openai.APIConnectionError as exc:
            # Name the server and where it is configured: the operator's next step.
            raise ProviderUnavailable(
                f"model server at {self.client.base_url} (a backend's base_url in "
                f"RUNBUS_MODEL_ROUTES) does not answer: {exc.__cause__ or exc}"
            ) from None
        except openai.APIStatusError as exc:
            raise _classify(exc) from None
        except openai.APIError as exc:  # an error event inside the stream
            raise ProviderUnavailable(f"stream error: {exc.message}") from None
        except ValueError as exc:  # an event that is not JSON
            raise ProviderUnavailable(f"unreadable stream: {exc}") from None
        except RunbusError:
            raise
        except Exception as exc:
            # Whatever else the SDK lets through is still this provider failing: the route's
            # retries and fallbacks handle it, and the run does not fail as `internal`.
            log.exception("provider_call_failed", model=self.model)
            raise ProviderUnavailable(f"unexpected {type(exc).__name__}: {exc}") from None
        reply = assembler.result()
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


def _classify(exc: openai.APIStatusError) -> Exception:
    status = exc.status_code
    reason = f"HTTP {status}: {exc.message}"
    if status == 429 or status >= 500 or status in (408, 409):
        return ProviderUnavailable(
            reason, status=status, retry_after=retry_after(exc.response.headers)
        )
    if status in (401, 403, 404):
        return TargetMisconfigured(reason, status=status)
    return ProviderRejected(reason, status=status)
