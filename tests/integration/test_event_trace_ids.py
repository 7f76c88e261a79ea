"""A followed run's events and its record name the run's trace: live and replayed, from the
start or after a sequence, the trace id `start_traced` returned and the gateway's spans carry;
an event published without trace context, or with a malformed one, still arrives, naming
none."""

import asyncio
from collections.abc import AsyncIterator

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_trace_id

from runbus import ops, subjects
from runbus.client import SequencedEvent, connect
from runbus.messages import RunCompleted, RunStarted, encode
from runbus.messages.runs import RunGet
from runbus_ingress.sse import event_type
from tests.helpers import eventually
from tests.stack import SecuredNats, Stack


async def _collect(items: AsyncIterator[SequencedEvent]) -> list[SequencedEvent]:
    return [item async for item in items]


async def test_live_and_replayed_events_carry_the_trace_id_of_the_runs_trace(
    stack: Stack, nats_server: SecuredNats, spans: InMemorySpanExporter
) -> None:
    async with connect(nats_server.client_url, token="dev-alice") as client:
        live = asyncio.create_task(_collect(client.follow("r-traced", timeout=20)))
        run_id, trace_id = await client.start_traced(
            "travel", "Weather in Sydney?", session_id="t1", run_id="r-traced"
        )
        followed = await asyncio.wait_for(live, 30)
        replayed = await _collect(client.follow(run_id, timeout=5))
        resumed = await _collect(client.follow(run_id, after=replayed[1].seq, timeout=5))
        record = (await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record

    def run_span_traces() -> set[str]:
        return {
            format_trace_id(s.context.trace_id)
            for s in spans.get_finished_spans()
            if s.name == "invoke_agent travel"
        }

    # The gateway's span of the run is in the trace the events name (Jaeger shows this one).
    assert await eventually(run_span_traces) == {trace_id}
    assert [i.seq for i in followed] == [i.seq for i in replayed]
    assert resumed == replayed[2:]
    # Text deltas come from the model router, the rest from the gateway: all in the run's trace.
    assert {"run.started", "run.text_delta", "run.completed"} <= {
        event_type(i.event) for i in replayed
    }
    assert {i.trace_id for i in followed + replayed} == {trace_id}
    assert record.trace_id == trace_id  # the run's record names it too, for a later look


async def test_an_event_with_no_or_a_malformed_traceparent_arrives_naming_no_trace(
    stack: Stack, nats_server: SecuredNats, nc: NATS
) -> None:
    # A service (or a hand-made publish) stores events without runbus's trace context.
    subject = subjects.events("acme", "alice", "r-untraced")
    js = nc.jetstream()
    started = RunStarted(run_id="r-untraced", session_id="t2", agent="travel")
    await js.publish(subject, encode(started), headers={"traceparent": "00-not-a-trace-01"})
    done = RunCompleted(run_id="r-untraced", response=[], text="done")
    await js.publish(subject, encode(done))
    async with connect(nats_server.client_url, token="dev-alice") as alice:
        events = await _collect(alice.follow("r-untraced", timeout=5))

    assert [(i.event, i.trace_id) for i in events] == [(started, ""), (done, "")]
