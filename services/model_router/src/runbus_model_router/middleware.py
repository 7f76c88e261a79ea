"""Chat-client middleware: the innermost layer, wrapped around every attempt at a target. Each
sees the prompt exactly as that target gets it. Built in: the gen_ai span, latency and token
metrics (OpenTelemetry gen_ai metrics) and the opt-in, redacted prompt audit log."""

import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, assert_never

import structlog
from opentelemetry.metrics import MeterProvider, get_meter_provider
from opentelemetry.trace import Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from runbus import __version__
from runbus.errors import RunbusError
from runbus.headers import RunContext
from runbus.messages import (
    Content,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ModelRequest,
    ModelResponse,
    ReasoningContent,
    TextContent,
    UriContent,
    UsageContent,
)

from .backends import OnDelta
from .routing import Target

RESPONSE_ID: Final = "gen_ai.response.id"

log = structlog.get_logger()


@dataclass(frozen=True)
class ModelCall:
    """One attempt at one target."""

    ctx: RunContext
    route: str
    target: Target
    request: ModelRequest
    """The prompt exactly as the backend gets it (placeholders applied, reasoning of other
    provider families removed, the repair turn appended)."""
    on_delta: OnDelta
    attempt: int
    """0 for the first try at this target, then 1, 2, … for retries."""


Next = Callable[[ModelCall], Awaitable[ModelResponse]]


class ChatMiddleware(Protocol):
    async def __call__(self, call: ModelCall, call_next: Next) -> ModelResponse: ...


def chain(middleware: Sequence[ChatMiddleware], last: Next) -> Next:
    """`middleware[0]` outermost, `last` (the backend) innermost."""
    handler = last
    for layer in reversed(middleware):
        handler = _bind(layer, handler)
    return handler


def _bind(layer: ChatMiddleware, call_next: Next) -> Next:
    async def handler(call: ModelCall) -> ModelResponse:
        return await layer(call, call_next)

    return handler


def _request_attributes(call: ModelCall) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": call.target.family,
        "gen_ai.request.model": call.target.model,
        "runbus.model.route": call.route,
        "runbus.model.attempt": call.attempt,
    }
    request = call.request
    if request.max_output_tokens:
        attributes["gen_ai.request.max_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        attributes["gen_ai.request.temperature"] = request.temperature
    if request.top_p is not None:
        attributes["gen_ai.request.top_p"] = request.top_p
    if request.stop:
        attributes["gen_ai.request.stop_sequences"] = request.stop
    if request.seed is not None:
        attributes["gen_ai.request.seed"] = request.seed
    if call.target.server:
        attributes["server.address"], attributes["server.port"] = call.target.server
    return attributes


def error_type(exc: BaseException) -> str:
    return exc.code if isinstance(exc, RunbusError) else type(exc).__name__


class Tracing:
    """A `chat <model>` span per attempt with gen_ai semantic-convention attributes."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    async def __call__(self, call: ModelCall, call_next: Next) -> ModelResponse:
        with self.tracer.start_as_current_span(
            f"chat {call.target.model}",
            attributes=_request_attributes(call),
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if call.request.message_id:
                # runbus's id of the message this call writes; a provider's own completion id
                # replaces it (set by its backend inside this span).
                span.set_attribute(RESPONSE_ID, call.request.message_id)
            try:
                response = await call_next(call)
            except Exception as exc:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                span.set_attribute("error.type", error_type(exc))
                raise
            span.set_attributes(
                {
                    "gen_ai.response.model": response.model,
                    "gen_ai.response.finish_reasons": [response.finish_reason],
                    "gen_ai.usage.input_tokens": response.usage.input_tokens,
                    "gen_ai.usage.output_tokens": response.usage.output_tokens,
                }
            )
            return response


class Metrics:
    """`gen_ai.client.operation.duration` and `gen_ai.client.token.usage` histograms."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        meter = (meter_provider or get_meter_provider()).get_meter(
            "runbus.model_router", __version__
        )
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="Model call duration"
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens per model call"
        )

    async def __call__(self, call: ModelCall, call_next: Next) -> ModelResponse:
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": call.target.family,
            "gen_ai.request.model": call.target.model,
        }
        started = time.perf_counter()
        try:
            response = await call_next(call)
        except Exception as exc:
            elapsed = time.perf_counter() - started
            self.duration.record(elapsed, {**attributes, "error.type": error_type(exc)})
            raise
        self.duration.record(time.perf_counter() - started, attributes)
        for kind, count in (
            ("input", response.usage.input_tokens),
            ("output", response.usage.output_tokens),
        ):
            self.tokens.record(count, {**attributes, "gen_ai.token.type": kind})
        return response


DEFAULT_REDACTIONS: Final = (
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",  # e-mail addresses
    r"\b(?:\d[ -]?){12,18}\d\b",  # card and account numbers
    r"(?i:\bbearer\s+[A-Za-z0-9._~+/=-]+)",  # bearer tokens
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}",  # API keys
    r"(?i:\b(?:password|passwd|secret|api[_-]?key|token)\s*[:=]\s*\S+)",
)
REDACTED: Final = "[redacted]"


class Redactor:
    def __init__(self, extra: Sequence[str] = ()) -> None:
        # Kept apart, not joined into one pattern: a configured pattern may carry global flags.
        self.patterns = [re.compile(p) for p in (*DEFAULT_REDACTIONS, *extra)]

    def __call__(self, text: str) -> str:
        for pattern in self.patterns:
            text = pattern.sub(REDACTED, text)
        return text


class PromptAudit:
    """Logs each prompt as sent (`model_prompt_sent`), with secrets and personal data
    redacted and media reduced to their type and size. Opt-in: prompts are user data."""

    def __init__(self, redact: Redactor) -> None:
        self.redact = redact

    def _part(self, part: Content) -> dict[str, Any]:
        match part:
            case TextContent(text=text):
                return {"text": self.redact(text)}
            case ReasoningContent(text=text):
                return {"reasoning": self.redact(text)}
            case DataContent(media_type=media_type, data=data):
                return {"data": media_type, "bytes": len(data)}
            case UriContent(uri=uri):
                return {"uri": self.redact(uri.split(",", 1)[0])}
            case FunctionCallContent(name=name, arguments=arguments, call_id=call_id):
                return {
                    "call": name,
                    "call_id": call_id,
                    "arguments": self.redact(str(arguments)),
                }
            case FunctionResultContent(call_id=call_id, result=result, error=error):
                shown = error if error is not None else str(result)
                return {"result_of": call_id, "result": self.redact(shown)}
            case UsageContent():
                return {"part": type(part).__name__}
            case _:
                assert_never(part)

    async def __call__(self, call: ModelCall, call_next: Next) -> ModelResponse:
        log.info(
            "model_prompt_sent",
            route=call.route,
            model=call.target.model,
            target=call.target.key,
            attempt=call.attempt,
            tools=[t.name for t in call.request.tools],
            prompt=[
                {"role": m.role, "source": m.source, "parts": [self._part(p) for p in m.contents]}
                for m in call.request.messages
            ],
        )
        return await call_next(call)
