"""What a run looks like in Jaeger: a 3-tool run, exported by the real OTLP/HTTP exporter (as
`OTEL_EXPORTER_OTLP_ENDPOINT` configures it) into a loopback receiver, is one trace whose span
tree — names, kinds, services, parents, key attributes — is the golden shape.

Ids, timings and sizes are normalised away; siblings are sorted; identical siblings are
merged with a count. History appends are group-committed, so their count is timing-dependent
and shows as "1+". After an intended change of the trace design, regenerate the golden file
with `UPDATE_TRACE_SHAPE=1 pytest tests/integration/test_trace_shape.py` and review the diff.
"""

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import nats
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from runbus_examples import AGENTS_DIR
from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_gateway.agents import AgentSpec, MemoryPolicy, load_agents
from tests.helpers import publish_and_collect, raw_request, types
from tests.otlp_receiver import serve_traces
from tests.stack import SecuredNats, start_stack

GOLDEN: Final = Path(__file__).parent / "golden" / "trace-shape.3-tool-run.json"
RUN_ID: Final = "r-shape"
SESSION_ID: Final = "s-shape"

# Two tools in parallel, then one more, then the answer: three tools, three model calls.
SCRIPT: Final = [
    ScriptedReply(
        tool_calls=[
            ScriptedCall("get_weather", {"city": "Sydney"}),
            ScriptedCall(
                "search_flights",
                {"origin": "Melbourne", "destination": "Sydney", "date": "2026-12-08"},
            ),
        ]
    ),
    ScriptedReply(tool_calls=[ScriptedCall("create_booking", {"flight_id": "QF412-20261208"})]),
    ScriptedReply(text="Booked: {last_result}"),
]

# Attributes whose values are part of the shape.
KEY_ATTRIBUTES: Final = {
    "messaging.system",
    "messaging.operation.type",
    "messaging.operation.name",
    "messaging.destination.name",
    "messaging.destination.template",
    "messaging.consumer.group.name",
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.agent.name",
    "gen_ai.conversation.id",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.response.finish_reasons",
    "gen_ai.tool.name",
    "runbus.run_id",
    "runbus.tenant",
    "runbus.attempt",
    "error.type",
}
# Attributes that must be there but whose values vary (ids, counts): shown as "*".
PRESENT_ATTRIBUTES: Final = {
    "gen_ai.tool.call.id",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
}
GROUP_COMMITTED: Final = {"send runbus.history.append", "send runbus.hist.{tenant}.{session_id}"}


class RawReceiver:
    """OTLP/HTTP trace receiver keeping whole spans (kind, links, typed attributes)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Span]] = []
        self._lock = threading.Lock()

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((service, span) for span in scope_spans.spans)

    def snapshot(self) -> list[tuple[str, Span]]:
        with self._lock:
            return list(self.spans)


@contextmanager
def raw_receiver() -> Iterator[tuple[RawReceiver, str]]:
    receiver = RawReceiver()
    with serve_traces(receiver) as endpoint:
        yield receiver, endpoint


def _value(key: str, value: Any) -> Any:
    if key in PRESENT_ATTRIBUTES:
        return "*"
    if isinstance(value, str):
        return value.replace(RUN_ID, "{run_id}").replace(SESSION_ID, "{session_id}")
    return value


def _attributes(span: Span) -> dict[str, Any]:
    shown = {}
    for attribute in span.attributes:
        if attribute.key in KEY_ATTRIBUTES | PRESENT_ATTRIBUTES:
            # {"stringValue": "x"} → "x", {"intValue": "1"} → "1", arrays → lists of those.
            raw = MessageToDict(attribute.value)
            value = next(iter(raw.values()))
            if isinstance(value, dict):
                value = [next(iter(v.values())) for v in value.get("values", [])]
            shown[attribute.key] = _value(attribute.key, value)
    return dict(sorted(shown.items()))


def shape(spans: list[tuple[str, Span]]) -> list[dict[str, Any]]:
    """The span forest as nested dicts, ids and timings gone, siblings sorted and merged."""
    children: dict[bytes, list[tuple[str, Span]]] = {}
    for service, span in spans:
        children.setdefault(span.parent_span_id, []).append((service, span))

    def node(service: str, span: Span) -> dict[str, Any]:
        shaped: dict[str, Any] = {
            "name": span.name,
            "kind": Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
            "service": service,
            "attributes": _attributes(span),
        }
        if span.links:
            shaped["links"] = len(span.links)
        below = forest(span.span_id)
        if below:
            shaped["children"] = below
        return shaped

    def forest(parent: bytes) -> list[dict[str, Any]]:
        nodes = sorted(
            (node(service, span) for service, span in children.get(parent, [])),
            key=lambda n: json.dumps(n, sort_keys=True),
        )
        merged: list[dict[str, Any]] = []
        for current in nodes:
            if merged and {k: v for k, v in merged[-1].items() if k != "count"} == current:
                merged[-1]["count"] = merged[-1].get("count", 1) + 1
            else:
                merged.append(dict(current))
        for item in merged:
            if item["name"] in GROUP_COMMITTED:
                item["count"] = "1+"
        return merged

    return forest(b"")


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[RawReceiver]:
    with raw_receiver() as (running, endpoint):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        yield running


async def test_a_three_tool_run_is_one_trace_with_the_golden_span_tree(
    receiver: RawReceiver, nats_server: SecuredNats, tmp_path: Path
) -> None:
    travel = load_agents(AGENTS_DIR)["travel"]
    planner = AgentSpec(
        name="planner",
        instructions="You plan trips.",
        model="scripted/planner",
        tools=travel.tools,
        memory=MemoryPolicy(enabled=True, store_user_statements=True),
    )
    providers = []
    try:
        async with start_stack(
            nats_server.url,
            data_dir=tmp_path / "data",
            agents={"planner": planner},
            scripts={"planner": SCRIPT},
        ) as stack:
            providers = list(stack.providers.values())
            nc = await nats.connect(nats_server.url)
            events = await publish_and_collect(
                nc,
                RUN_ID,
                raw_request(
                    RUN_ID,
                    "I live in Melbourne. Book me the morning flight to Sydney.",
                    agent="planner",
                    session_id=SESSION_ID,
                ),
                subject="runbus.runs.planner",
            )
            await nc.drain()
    finally:
        # The stack has drained: every span has ended. Shutting down exports the rest.
        for provider in providers:
            provider.shutdown()
    assert types(events)[-1] == "run.completed"
    assert types(events).count("run.tool_result") == 3

    spans = receiver.snapshot()
    assert len({span.trace_id for _, span in spans}) == 1
    ids = {span.span_id for _, span in spans}
    assert [s.name for _, s in spans if s.parent_span_id and s.parent_span_id not in ids] == []
    actual = shape(spans)
    if os.environ.get("UPDATE_TRACE_SHAPE") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n")
    assert actual == json.loads(GOLDEN.read_text())


def test_shape_merges_identical_siblings_and_keeps_different_ones_apart() -> None:
    def span(name: str, span_id: bytes, parent: bytes, tool: str = "") -> Span:
        made = Span(name=name, span_id=span_id, parent_span_id=parent, kind=Span.SPAN_KIND_CLIENT)
        if tool:
            attribute = made.attributes.add()
            attribute.key = "gen_ai.tool.name"
            attribute.value.string_value = tool
        return made

    spans = [
        ("gateway", span("root", b"r", b"")),
        ("gateway", span("send x", b"a", b"r", tool="t1")),
        ("gateway", span("send x", b"b", b"r", tool="t1")),
        ("gateway", span("send x", b"c", b"r", tool="t2")),
    ]

    [root] = shape(spans)

    assert [(c["attributes"], c.get("count")) for c in root["children"]] == [
        ({"gen_ai.tool.name": "t1"}, 2),
        ({"gen_ai.tool.name": "t2"}, None),
    ]
