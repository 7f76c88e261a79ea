"""Tracing: provider setup (OTLP when `OTEL_EXPORTER_OTLP_*` is set) and W3C trace context in
NATS headers. The only module that knows how trace context travels."""

import os
from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from .headers import TRACEPARENT

_PROPAGATOR: Final = TraceContextTextMapPropagator()
OTLP_ENDPOINT_VARS: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def create_tracer_provider(
    service_name: str, *, processors: Iterable[SpanProcessor] = ()
) -> TracerProvider:
    """A provider for one service; exports over OTLP/HTTP when an endpoint is configured.

    The standard `OTEL_*` variables apply (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
    `OTEL_EXPORTER_OTLP_*`, `OTEL_SDK_DISABLED`, and `OTEL_TRACES_SAMPLER`/`_ARG`, e.g.
    `parentbased_traceidratio` with `0.01`: a run is kept or dropped whole, at its root).
    """
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if any(os.environ.get(var) for var in OTLP_ENDPOINT_VARS):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def setup_tracing(service_name: str) -> TracerProvider:
    """Create the process-wide provider of a service process."""
    provider = create_tracer_provider(service_name)
    trace.set_tracer_provider(provider)
    return provider


def inject(headers: dict[str, str], context: Context | None = None) -> None:
    """Write `traceparent`/`tracestate` of the current (or given) span into `headers`."""
    _PROPAGATOR.inject(headers, context=context)


def extract(headers: Mapping[str, str] | None) -> Context:
    """The remote parent carried by `headers` (an empty context if none)."""
    if not headers or TRACEPARENT not in headers:
        return Context()
    return _PROPAGATOR.extract(headers)


def start_span(
    tracer: Tracer,
    name: str,
    kind: SpanKind,
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    context: Context | None = None,
) -> Span:
    """Start a span that is not made current; its attributes are kept only when it records.

    The hop path uses this instead of `start_as_current_span`: a client span never has
    children (it only needs to be injected), and a span the sampler drops gets no attributes.
    """
    span = tracer.start_span(name, context=context, kind=kind)
    if attributes and span.is_recording():
        span.set_attributes(attributes)
    return span


def record_failure(span: Span, exc: BaseException) -> None:
    """What `start_as_current_span` does for an exception leaving its block: an exception
    event and an ERROR status."""
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def messaging_attributes(
    subject: str, operation: str, *, message_size: int | None = None
) -> dict[str, AttributeValue]:
    """OpenTelemetry messaging semantic-convention attributes for one NATS hop."""
    attrs: dict[str, AttributeValue] = {
        "messaging.system": "nats",
        "messaging.destination.name": subject,
        "messaging.operation.type": operation,
    }
    if message_size is not None:
        attrs["messaging.message.body.size"] = message_size
    return attrs
