"""What the ingress tells operators: an HTTP run's trace starts at the HTTP server span (with
OpenTelemetry's HTTP server attributes) and that span lasts the whole run; each request is one
access log line; the ingress process writes its lines to the data directory's logs, where
`runbus logs <run>` finds them."""

import asyncio
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from structlog.testing import capture_logs

from runbus.telemetry import create_tracer_provider
from tests.integration.ingress.conftest import ALICE, ingress
from tests.integration.ingress.test_runs_api import read_sse
from tests.otlp_receiver import serve_traces
from tests.stack import SecuredNats, Stack, start_stack


def _attributes(pairs: Any) -> dict[str, Any]:
    def value(pair: KeyValue) -> Any:
        shown = MessageToDict(pair.value)
        if "intValue" in shown:
            return int(shown["intValue"])
        return next(iter(shown.values()), None)

    return {pair.key: value(pair) for pair in pairs}


@dataclass(frozen=True)
class Received:
    resource: dict[str, Any]
    span: Span

    @property
    def attributes(self) -> dict[str, Any]:
        return _attributes(self.span.attributes)


class Receiver:
    """OTLP/HTTP receiver keeping each span whole, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self._lock = threading.Lock()

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(Received(resource, s) for s in scope_spans.spans)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    running = Receiver()
    with serve_traces(running) as endpoint:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        yield running


async def test_an_http_runs_trace_is_rooted_in_the_http_server_span_which_lasts_the_run(
    receiver: Receiver, nats_server: SecuredNats, tmp_path: Path
) -> None:
    ingress_traces = create_tracer_provider("http_ingress")
    providers = [ingress_traces]
    try:
        async with start_stack(nats_server.url, data_dir=tmp_path) as stack:
            providers += stack.providers.values()
            async with (
                ingress(nats_server.url, tracer_provider=ingress_traces) as (base, http),
                http.post(
                    "/v1/runs?wait=true",
                    json={"agent": "travel", "text": "Weather?"},
                    headers=ALICE,
                ) as response,
            ):
                status = response.status
                run_id = response.headers["Runbus-Run-Id"]
                trace_id = response.headers["Runbus-Trace-Id"]
    finally:
        for provider in providers:
            provider.shutdown()  # exports what is left

    spans = [s for s in receiver.spans if s.span.trace_id.hex() == trace_id]
    (root,) = [s for s in spans if not s.span.parent_span_id]
    attributes = root.attributes
    invoke = next(s for s in spans if s.span.name == "invoke_agent travel")
    chats = [s for s in spans if s.span.name.startswith("chat ")]
    bus = [s for s in spans if s.span.name.startswith(("send ", "process "))]

    assert status == 200
    assert (root.resource["service.name"], root.span.name) == ("http_ingress", "POST /v1/runs")
    assert root.span.kind == Span.SpanKind.SPAN_KIND_SERVER
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/runs"
    assert attributes["http.response.status_code"] == 200
    assert attributes["url.path"] == "/v1/runs"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == int(base.rsplit(":", 1)[1])
    assert attributes["runbus.run_id"] == run_id
    # The span covers the run: it starts before anything of the run and ends after the agent.
    assert root.span.start_time_unix_nano <= min(s.span.start_time_unix_nano for s in spans)
    assert root.span.end_time_unix_nano >= invoke.span.end_time_unix_nano
    assert bus
    assert all(
        s.attributes["messaging.system"] == "nats"
        and s.attributes["messaging.destination.name"]
        and s.attributes["messaging.operation.type"] in ("send", "process")
        for s in bus
    )
    assert chats
    assert all(s.attributes.get("gen_ai.response.id") for s in chats)
    # Replicas are told apart: every service names the instance that made the span.
    assert all(s.resource.get("service.instance.id") for s in spans)


async def test_a_callers_traceparent_makes_the_http_span_its_child(
    stack: Stack, receiver: Receiver, nats_server: SecuredNats
) -> None:
    """(The stack comes first: its spans are not exported to this receiver.)"""
    ingress_traces = create_tracer_provider("http_ingress")
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    try:
        async with (
            ingress(nats_server.url, tracer_provider=ingress_traces) as (_, http),
            http.get("/v1/agents", headers={**ALICE, "traceparent": parent}) as response,
        ):
            status = response.status
    finally:
        ingress_traces.shutdown()

    (span,) = [s for s in receiver.spans if s.resource["service.name"] == "http_ingress"]
    assert status == 200
    assert (span.span.trace_id.hex(), span.span.parent_span_id.hex()) == ("a" * 32, "b" * 16)
    assert span.span.name == "GET /v1/agents"


async def test_every_request_is_one_access_log_line_with_its_route_status_duration_and_run(
    http: aiohttp.ClientSession,
) -> None:
    with capture_logs() as logs:
        async with http.post(
            "/v1/runs?wait=true", json={"agent": "travel", "text": "Hi"}, headers=ALICE
        ) as response:
            run_id = response.headers["Runbus-Run-Id"]
        async with http.get("/v1/runs/r-nobody", headers=ALICE) as missing:
            missing_status = missing.status
        async with http.get("/no/such/page"):
            pass
    lines = [e for e in logs if e["event"] == "http_request"]

    assert missing_status == 404
    assert [(e["method"], e["route"], e["status"], e["run_id"]) for e in lines] == [
        ("POST", "/v1/runs", 200, run_id),
        ("GET", "/v1/runs/{run_id}", 404, "r-nobody"),
        ("GET", None, 404, None),
    ]
    assert all(e["duration_ms"] >= 0 for e in lines)
    assert lines[0]["path"] == "/v1/runs"


@pytest.mark.subprocess
async def test_the_ingress_process_logs_to_the_data_dir_where_runbus_logs_finds_a_run(
    stack: Stack, nats_server: SecuredNats, tmp_path: Path
) -> None:
    env = {**os.environ, "RUNBUS_NATS_URL": nats_server.url, "RUNBUS_DATA_DIR": str(tmp_path)}
    bin_dir = Path(sys.executable).parent
    process = await asyncio.create_subprocess_exec(
        str(bin_dir / "runbus"), "http", "--port", "0", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        base = await asyncio.wait_for(_listening_url(process.stderr), 30)
        body = {"agent": "travel", "text": "Weather in Sydney?"}
        async with (
            aiohttp.ClientSession(base) as http,
            http.post("/v1/runs", json=body, headers=ALICE) as response,
        ):
            run_id = response.headers["Runbus-Run-Id"]
            await read_sse(response)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
    found = await asyncio.create_subprocess_exec(
        str(bin_dir / "runbus"), "logs", run_id, "--json", env=env, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await found.communicate()
    lines = [json.loads(line) for line in out.decode().splitlines()]

    assert (tmp_path / "logs" / "http_ingress.log").exists()
    assert found.returncode == 0
    assert {"http_run_started", "http_request"} <= {line["event"] for line in lines}
    assert all(line["service"] == "http_ingress" for line in lines)


async def _listening_url(stderr: asyncio.StreamReader) -> str:
    while line := await stderr.readline():
        entry = json.loads(line)
        if entry["event"] == "http_listening":
            return str(entry["url"])
    raise AssertionError("the ingress exited before it listened")
