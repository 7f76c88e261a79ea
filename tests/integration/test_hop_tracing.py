"""One request/reply hop in a trace: a CLIENT span in the caller, its SERVER child in the
service, messaging attributes on both, failures on both; and a sampler chosen by the standard
`OTEL_TRACES_SAMPLER` variables that drops a hop whole."""

from collections.abc import AsyncIterator, Callable

import msgspec
import pytest
from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode

from runbus.bus import Bus
from runbus.errors import NotFound, RemoteError
from runbus.headers import RunContext
from runbus.service import Endpoint, Service, ServiceOptions
from runbus.telemetry import create_tracer_provider


class Echo(msgspec.Struct, frozen=True):
    text: str


ECHO_DECODER = msgspec.json.Decoder(Echo)
CTX = RunContext(run_id="r-hop", props={"user_id": "alice", "tenant": "acme"})


class EchoService(Service):
    name = "echo"

    def __init__(self, nc: NATS, options: ServiceOptions) -> None:
        super().__init__(nc, options=options)
        self.seen: list[SpanContext] = []

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("echo", "test.echo.r-hop", ECHO_DECODER, self.on_echo, "test.echo.{run}"),
            Endpoint("missing", "test.missing", ECHO_DECODER, self.on_missing),
        ]

    async def on_echo(self, ctx: RunContext, request: Echo) -> Echo:
        self.seen.append(trace.get_current_span().get_span_context())
        return Echo(text=request.text)

    async def on_missing(self, ctx: RunContext, request: Echo) -> Echo:
        raise NotFound("no such thing")


Hop = tuple[Bus, EchoService, InMemorySpanExporter]


@pytest.fixture
async def hop(nc: NATS) -> AsyncIterator[Callable[[], Hop]]:
    """Builds (after a test set its environment) a service and a bus exporting to one list."""
    started: list[EchoService] = []

    def build() -> Hop:
        exporter = InMemorySpanExporter()
        provider = create_tracer_provider("echo", processors=[SimpleSpanProcessor(exporter)])
        service = EchoService(nc, ServiceOptions(tracer_provider=provider))
        started.append(service)
        return Bus(nc, provider.get_tracer("test")), service, exporter

    yield build
    for service in started:
        await service.stop()


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> ReadableSpan:
    [span] = [s for s in spans if s.kind is kind]
    return span


async def test_a_hop_is_a_client_span_with_the_service_span_as_its_child(
    hop: Callable[[], Hop],
) -> None:
    bus, service, exporter = hop()
    await service.start()

    reply = await bus.request(
        "test.echo.r-hop", Echo(text="hi"), ECHO_DECODER, ctx=CTX, span_subject="test.echo.{run}"
    )

    assert reply == Echo(text="hi")
    spans = exporter.get_finished_spans()
    client, server = by_kind(spans, SpanKind.CLIENT), by_kind(spans, SpanKind.SERVER)
    assert (client.name, server.name) == ("send test.echo.{run}", "process test.echo.{run}")
    assert server.parent is not None
    assert client.context is not None
    assert server.parent.span_id == client.context.span_id
    assert server.context is not None
    assert service.seen == [server.context]
    for span, operation in ((client, "send"), (server, "process")):
        assert span.attributes is not None
        assert dict(span.attributes) == {
            "messaging.system": "nats",
            "messaging.destination.name": "test.echo.r-hop",
            "messaging.operation.type": operation,
            "messaging.message.body.size": len(b'{"text":"hi"}'),
        }


async def test_a_failed_hop_is_an_error_on_both_sides(hop: Callable[[], Hop]) -> None:
    bus, service, exporter = hop()
    await service.start()

    with pytest.raises(RemoteError):
        await bus.request("test.missing", Echo(text="hi"), ECHO_DECODER, ctx=CTX)

    spans = exporter.get_finished_spans()
    client, server = by_kind(spans, SpanKind.CLIENT), by_kind(spans, SpanKind.SERVER)
    assert client.status.status_code is StatusCode.ERROR
    assert [event.name for event in client.events] == ["exception"]
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes is not None
    assert server.attributes["error.type"] == "not_found"


async def test_a_sampler_from_the_environment_drops_the_hop_whole(
    hop: Callable[[], Hop], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    bus, service, exporter = hop()
    await service.start()

    reply = await bus.request("test.echo.r-hop", Echo(text="hi"), ECHO_DECODER, ctx=CTX)

    assert reply == Echo(text="hi")
    assert exporter.get_finished_spans() == ()
    # The service still joined the caller's (unsampled) trace rather than starting its own.
    [seen] = service.seen
    assert seen.is_valid
    assert not seen.trace_flags.sampled
