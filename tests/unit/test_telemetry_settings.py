"""The standard OpenTelemetry variables are honoured; with nothing to export to, spans do not
record (trace ids still travel); a collector that is down is one log line naming it."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus.embedded import EmbeddedNats
from runbus.telemetry import TelemetryConfigError, create_tracer_provider

OTEL_VARS = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_TRACES_SAMPLER",
)


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in OTEL_VARS:
        monkeypatch.delenv(var, raising=False)


def test_otel_service_name_and_resource_attributes_are_honoured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "runbus-gateway-eu")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")

    attributes = create_tracer_provider("gateway").resource.attributes

    assert attributes["service.name"] == "runbus-gateway-eu"
    assert attributes["deployment.environment"] == "staging"


def test_without_otel_service_name_the_service_is_named_after_itself() -> None:
    assert create_tracer_provider("gateway").resource.attributes["service.name"] == "gateway"


def test_each_replica_names_its_instance_as_its_srv_metadata_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = f"{socket.gethostname()}:{os.getpid()}"
    mine = create_tracer_provider("gateway").resource.attributes["service.instance.id"]
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=gateway-7f9c")
    named = create_tracer_provider("gateway").resource.attributes["service.instance.id"]

    assert mine == here
    assert named == "gateway-7f9c"


def test_with_nothing_to_export_to_spans_do_not_record_but_carry_trace_ids() -> None:
    span = create_tracer_provider("gateway").get_tracer("t").start_span("process x")

    assert not span.is_recording()
    assert span.get_span_context().is_valid


def test_with_a_processor_spans_record() -> None:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider("gateway", processors=[SimpleSpanProcessor(exporter)])

    provider.get_tracer("t").start_span("process x").end()

    assert [s.name for s in exporter.get_finished_spans()] == ["process x"]


def test_traces_exporter_none_exports_nothing_even_with_an_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")

    span = create_tracer_provider("gateway").get_tracer("t").start_span("process x")

    assert not span.is_recording()


def test_an_unknown_traces_exporter_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")

    with pytest.raises(TelemetryConfigError, match="OTEL_TRACES_EXPORTER: 'zipkin'"):
        create_tracer_provider("gateway")


def test_a_collector_that_is_down_is_one_line_naming_it_and_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with EmbeddedNats(tmp_path / "js") as server:
        port = server.url.rsplit(":", 1)[1]  # a port nothing listens on once it stopped
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    provider = create_tracer_provider("gateway")

    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            provider.get_tracer("t").start_span("process x").end()
            provider.force_flush()
    provider.shutdown()

    down = [line for line in logs if line["event"] == "otlp_collector_down"]
    assert len(down) == 1
    assert down[0]["endpoint"] == f"{endpoint}/v1/traces"
    assert down[0]["variable"] == "OTEL_EXPORTER_OTLP_ENDPOINT"


@pytest.mark.parametrize(
    ("propagators", "sent"),
    [
        (None, ["baggage", "traceparent"]),
        ("tracecontext", ["traceparent"]),
    ],
)
def test_otel_propagators_decides_what_travels_in_the_headers(
    propagators: str | None, sent: list[str]
) -> None:
    script = (
        "from opentelemetry import baggage, context, trace\n"
        "from runbus.telemetry import create_tracer_provider, inject\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "keep = [SimpleSpanProcessor(InMemorySpanExporter())]\n"
        "p = create_tracer_provider('g', processors=keep)\n"
        "span = p.get_tracer('t').start_span('x')\n"
        "ctx = baggage.set_baggage('tenant', 'acme', trace.set_span_in_context(span))\n"
        "headers = {}\n"
        "inject(headers, ctx)\n"
        "print(','.join(sorted(headers)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (*OTEL_VARS, "OTEL_PROPAGATORS")}
    if propagators is not None:
        env["OTEL_PROPAGATORS"] = propagators

    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout

    assert out.strip().split(",") == sent
