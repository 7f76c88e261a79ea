"""Chat-client middleware around each attempt: the gen_ai span, metrics and the prompt audit."""

import dataclasses

import msgspec
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    DataContent,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    TextContent,
)
from runbus_examples.scripted import ScriptedModel, ScriptedReply
from runbus_model_router.config import TargetConfig
from runbus_model_router.errors import ScriptExhausted
from runbus_model_router.middleware import (
    REDACTED,
    Metrics,
    ModelCall,
    PromptAudit,
    Redactor,
    Tracing,
    chain,
)
from runbus_model_router.routing import Target

SCRIPT = ScriptedModel("hi", [ScriptedReply(text="Hello there.")])
TARGET = Target(
    "local/small",
    SCRIPT,
    "small",
    "openai",
    TargetConfig(backend="local", model="small"),
    server=("127.0.0.1", 8080),
)
CTX = RunContext(run_id="r-1", agent="travel", props={"tenant": "acme"})


async def no_deltas(text: str) -> None:
    pass


def call(*contents: object, target: Target = TARGET) -> ModelCall:
    request = ModelRequest(
        route="cheap",
        messages=[ChatMessage(role="user", contents=list(contents))],  # type: ignore[arg-type]
        max_output_tokens=256,
    )
    return ModelCall(CTX, "cheap", target, request, no_deltas, 0)


async def backend(c: ModelCall) -> ModelResponse:
    return await c.target.backend.complete(c.request, c.on_delta)


async def test_each_attempt_is_a_chat_span_with_gen_ai_attributes() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    send = chain([Tracing(provider.get_tracer("t"))], backend)

    response = await send(call(TextContent(text="hi")))

    (span,) = spans.get_finished_spans()
    assert span.name == "chat small"
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "small",
        "gen_ai.request.max_tokens": 256,
        "server.address": "127.0.0.1",
        "server.port": 8080,
        "runbus.model.route": "cheap",
        "runbus.model.attempt": 0,
        "gen_ai.response.model": "scripted/hi",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": response.usage.input_tokens,
        "gen_ai.usage.output_tokens": response.usage.output_tokens,
    }


async def test_a_chat_span_names_the_message_it_writes_as_the_response_id() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    send = chain([Tracing(provider.get_tracer("t"))], backend)
    asked = call(TextContent(text="hi"))
    request = msgspec.structs.replace(asked.request, message_id="r-1:m0")

    await send(dataclasses.replace(asked, request=request))

    (span,) = spans.get_finished_spans()
    assert (span.attributes or {})["gen_ai.response.id"] == "r-1:m0"


async def test_a_failed_attempt_marks_its_span_with_the_error_type() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    empty = Target("t", ScriptedModel("none", []), "none", "runbus", TargetConfig(backend="t"))
    send = chain([Tracing(provider.get_tracer("t"))], backend)

    with pytest.raises(ScriptExhausted):
        await send(call(TextContent(text="hi"), target=empty))

    (span,) = spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["error.type"] == "model_error"
    assert not span.status.is_ok


async def test_latency_and_tokens_are_recorded_as_gen_ai_client_metrics() -> None:
    reader = InMemoryMetricReader()
    send = chain([Metrics(MeterProvider(metric_readers=[reader]))], backend)

    response = await send(call(TextContent(text="hi")))

    data = reader.get_metrics_data()
    assert data is not None
    metrics = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    (duration,) = metrics["gen_ai.client.operation.duration"].data.data_points
    assert isinstance(duration, HistogramDataPoint)
    assert duration.count == 1
    assert duration.attributes is not None
    assert duration.attributes["gen_ai.request.model"] == "small"
    tokens = {
        p.attributes["gen_ai.token.type"]: p.sum
        for p in metrics["gen_ai.client.token.usage"].data.data_points
        if isinstance(p, HistogramDataPoint) and p.attributes is not None
    }
    assert tokens == {
        "input": response.usage.input_tokens,
        "output": response.usage.output_tokens,
    }


@pytest.mark.parametrize(
    "secret",
    [
        "alice@example.com",
        "4111 1111 1111 1111",
        "Bearer abc.def-ghi",
        "sk-proj-abcdefghijklmnop1234",
        "password: hunter2",
    ],
)
def test_the_redactor_hides_secrets_and_personal_data(secret: str) -> None:
    redacted = Redactor()(f"my details: {secret} thanks")

    assert secret not in redacted
    assert REDACTED in redacted
    assert redacted.startswith("my details: ")


def test_the_redactor_takes_extra_patterns_from_config() -> None:
    assert Redactor([r"PNR-\d+"])("booking PNR-12345") == f"booking {REDACTED}"


async def test_the_prompt_audit_logs_the_prompt_as_sent_with_redactions() -> None:
    send = chain([PromptAudit(Redactor())], backend)

    with capture_logs() as logs:
        await send(
            call(
                TextContent(text="Mail bob@example.com the plan"),
                DataContent(data=b"\x89PNG", media_type="image/png"),
                FunctionCallContent(call_id="c", name="f", arguments={"to": "bob@example.com"}),
            )
        )

    (entry,) = [e for e in logs if e["event"] == "model_prompt_sent"]
    assert entry["model"] == "small"
    assert entry["route"] == "cheap"
    text, image, called = entry["prompt"][0]["parts"]
    assert text == {"text": f"Mail {REDACTED} the plan"}
    assert image == {"data": "image/png", "bytes": 4}
    assert "bob@example.com" not in str(called)
