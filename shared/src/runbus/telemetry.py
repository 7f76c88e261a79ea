"""Tracing: provider setup from the standard `OTEL_*` variables (an exporter only when one is
configured, non-recording otherwise) and trace context in NATS headers through the configured
propagators. The only module that knows how trace context travels."""

import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from typing import Final

import structlog
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from .headers import TRACEPARENT
from .instance import HOST_METADATA, PID_METADATA, instance_metadata

_PROPAGATOR: Final = propagate.get_global_textmap()
"""`OTEL_PROPAGATORS` (default `tracecontext,baggage`), read once at import."""
_FIELDS: Final = frozenset(_PROPAGATOR.fields)
"""Header names the propagators read: a message carrying none of them has no parent."""
OTLP_ENDPOINT_VARS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
EXPORTERS_VAR: Final = "OTEL_TRACES_EXPORTER"
INSTANCE_ID: Final = "service.instance.id"
DOWN_REPORT_EVERY: Final = 60.0
"""Seconds between two reports of an OTLP collector that keeps failing."""


class TelemetryConfigError(ValueError):
    """A standard `OTEL_*` variable names something runbus cannot do."""


def create_tracer_provider(
    service_name: str, *, processors: Iterable[SpanProcessor] = ()
) -> TracerProvider:
    """A provider for one service, from the standard variables: `OTEL_SERVICE_NAME` (else
    `service_name`), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_EXPORTER` (`otlp`, `console`,
    `none`; unset: OTLP/HTTP when an `OTEL_EXPORTER_OTLP_*ENDPOINT` is set), the
    `OTEL_EXPORTER_OTLP_*` options, `OTEL_TRACES_SAMPLER`/`_ARG` (e.g.
    `parentbased_traceidratio` with `0.01`: a run is kept or dropped whole, at its root),
    `OTEL_SDK_DISABLED`. With nothing to export to (no exporter, no `processors`), spans do not
    record: trace ids still travel and stamp log lines, at almost no cost.

    `service.instance.id` tells replicas apart: `<host>:<pid>`, the host and pid each replica
    publishes in its `$SRV` metadata (unless `OTEL_RESOURCE_ATTRIBUTES` names one).
    """
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    if INSTANCE_ID not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        metadata = instance_metadata()
        attributes[INSTANCE_ID] = f"{metadata[HOST_METADATA]}:{metadata[PID_METADATA]}"
    exporters = _exporters()
    processors = list(processors)
    sampler = ALWAYS_OFF if not exporters and not processors else None  # None: OTEL_TRACES_SAMPLER
    provider = TracerProvider(resource=Resource.create(attributes), sampler=sampler)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def _exporters() -> list[SpanExporter]:
    named = os.environ.get(EXPORTERS_VAR)
    if named is None:
        wanted = ["otlp"] if any(os.environ.get(var) for var in OTLP_ENDPOINT_VARS) else []
    else:
        wanted = [part.strip().lower() for part in named.split(",") if part.strip()]
    exporters: list[SpanExporter] = []
    for name in wanted:
        match name:
            case "none":
                return []
            case "otlp":
                exporters.append(_otlp_exporter())
            case "console":
                exporters.append(ConsoleSpanExporter())
            case _:
                raise TelemetryConfigError(
                    f"{EXPORTERS_VAR}: {name!r} is not an exporter runbus has (otlp, console, none)"
                )
    return exporters


def _otlp_exporter() -> SpanExporter:
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if protocol and protocol != "http/protobuf":
        raise TelemetryConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: runbus exports OTLP over http/protobuf, not {protocol!r}"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter()
    variable = next((v for v in OTLP_ENDPOINT_VARS if os.environ.get(v)), OTLP_ENDPOINT_VARS[1])
    _report_collector_failures(str(getattr(exporter, "_endpoint", "")), variable)
    return exporter


class _CollectorDown(logging.Handler):
    """The exporter's own retry warnings and failures (one or more per batch, with
    tracebacks) become one log line naming the collector and its variable, at most once a
    minute while it stays down."""

    def __init__(self, endpoint: str, variable: str) -> None:
        super().__init__(logging.WARNING)
        self.endpoint = endpoint
        self.variable = variable
        self._last = -DOWN_REPORT_EVERY
        self._since_last = 0

    def emit(self, record: logging.LogRecord) -> None:
        self._since_last += 1
        now = time.monotonic()
        if now - self._last < DOWN_REPORT_EVERY:
            return
        self._last = now
        structlog.get_logger().warning(
            "otlp_collector_down",
            endpoint=self.endpoint,
            variable=self.variable,
            detail=record.getMessage(),
            failures=self._since_last,
            note="spans are retried with backoff, then dropped; runs are not affected",
        )
        self._since_last = 0


def _report_collector_failures(endpoint: str, variable: str) -> None:
    logger = logging.getLogger("opentelemetry.exporter.otlp")
    for handler in list(logger.handlers):
        if isinstance(handler, _CollectorDown):
            logger.removeHandler(handler)
    logger.addHandler(_CollectorDown(endpoint, variable))
    logger.propagate = False


def setup_tracing(service_name: str) -> TracerProvider:
    """Create the process-wide provider of a service process."""
    provider = create_tracer_provider(service_name)
    trace.set_tracer_provider(provider)
    return provider


def inject(headers: dict[str, str], context: Context | None = None) -> None:
    """Write the current (or given) span's context into `headers` (`traceparent`, and
    whatever else `OTEL_PROPAGATORS` names)."""
    _PROPAGATOR.inject(headers, context=context)


def extract(headers: Mapping[str, str] | None) -> Context:
    """The remote parent carried by `headers` (an empty context if none)."""
    if not headers or _FIELDS.isdisjoint(headers):
        return Context()
    return _PROPAGATOR.extract(headers)


_TRACEPARENT: Final = re.compile(
    r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(?:(-.*)|[ \t]*)$"
)
"""W3C Trace Context's `traceparent`: version, trace id, parent span id, flags (a later version
may add fields), as OpenTelemetry's propagator reads it."""
_TRACEPARENT_MAX: Final = 512


def traceparent_trace_id(headers: Mapping[str, str] | None) -> str:
    """The trace id (32 hex digits) of the W3C `traceparent` in `headers`; "" when there is
    none or it is malformed (by the rules of OpenTelemetry's W3C propagator).

    Read straight off the header, not through `extract`: the SDK reads it from every event it
    follows, and building a context for each made a replay about a quarter slower (this, 4 %).
    """
    value = headers.get(TRACEPARENT) if headers else None
    if not value or len(value) > _TRACEPARENT_MAX:
        return ""
    match = _TRACEPARENT.search(value)
    if match is None:
        return ""
    version, trace_id, span_id, extra = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16 or version == "ff":
        return ""
    if version == "00" and extra:
        return ""
    return trace_id


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
