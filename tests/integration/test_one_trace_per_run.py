"""One run is one trace: every service's spans share the trace id, parents follow the hops."""

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.helpers import eventually, publish_and_collect, raw_request
from tests.stack import SERVICE_NAMES, Stack


def _service(span: ReadableSpan) -> str:
    return str(span.resource.attributes["service.name"])


async def _spans_of_run(spans: InMemorySpanExporter) -> list[ReadableSpan]:
    # Server spans end just after their reply is sent, before the hop's client span; the run's
    # root span ends after the run (at the request's ack): once it has, the run's hops are in.
    def whole() -> list[ReadableSpan]:
        finished = list(spans.get_finished_spans())
        return finished if any(s.parent is None for s in finished) else []

    return await eventually(whole)


async def test_every_service_span_of_a_run_shares_one_trace_and_follows_the_hops(
    stack: Stack, nc: NATS, spans: InMemorySpanExporter
) -> None:
    events = await publish_and_collect(
        nc, "r-trace", raw_request("r-trace", "Book me a flight from Melbourne to Sydney on friday")
    )
    assert events[-1]["type"] == "run.completed"

    finished = await _spans_of_run(spans)
    by_id = {s.context.span_id: s for s in finished}

    # The prompt stays under the travel agent's compaction trigger: no compaction hop.
    assert {_service(s) for s in finished} == set(SERVICE_NAMES) - {"compaction"}
    assert len({s.context.trace_id for s in finished}) == 1

    [root] = [s for s in finished if s.parent is None]
    assert root.name == "process runbus.runs.{agent}"
    assert _service(root) == "gateway"

    [run_span] = [s for s in finished if s.name == "invoke_agent travel"]
    assert run_span.parent is not None
    assert run_span.parent.span_id == root.context.span_id

    servers = [s for s in finished if s.name.startswith("process runbus.") and s is not root]
    assert servers, "no service handled a request"
    for server in servers:
        assert server.parent is not None
        client = by_id[server.parent.span_id]
        assert _service(client) == "gateway"
        assert client.name == server.name.replace("process ", "send ", 1)
        assert server.attributes is not None
        assert server.attributes["messaging.system"] == "nats"

    chats = [s for s in finished if s.name.startswith("chat ")]
    assert len(chats) == 3  # search, book, answer
    for chat in chats:
        assert chat.parent is not None
        assert by_id[chat.parent.span_id].name == "process runbus.model.complete"
        assert chat.attributes is not None
        output_tokens = chat.attributes["gen_ai.usage.output_tokens"]
        assert isinstance(output_tokens, int)
        assert output_tokens > 0

    tools = sorted(s.name for s in finished if s.name.startswith("execute_tool "))
    assert tools == ["execute_tool create_booking", "execute_tool search_flights"]
    for tool in (s for s in finished if s.name.startswith("execute_tool ")):
        assert tool.parent is not None
        assert by_id[tool.parent.span_id].name == "process runbus.tools.{name}.invoke"
