"""runbus benchmarks (`make bench`). Every ratio is against a baseline measured in the same run,
because the machine is shared and noisy.

1. hop: raw nats-py request/reply vs the same round trip through runbus's `Bus.request` and
   `Service` base (msgspec body, run headers, trace context, spans on).
2. run: one whole run of a scripted agent making 4 model calls and 3 tool calls — p50/p99
   latency, the bus hops it made, and runs/s with 64 runs in flight.
"""

import argparse
import asyncio
import importlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import nats
import uvloop
from nats.aio.msg import Msg
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.stack import start_stack

from bench.timing import pct, timed
from runbus.bus import Bus
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.logs import configure_logging
from runbus.messages import ChatMessage, CompactRequest, TextContent, encode
from runbus.messages.compaction import COMPACT_RESULT_DECODER
from runbus.service import Endpoint, Service
from runbus.settings import load_settings
from runbus.supervisor import ProcessStack
from runbus.telemetry import create_tracer_provider
from runbus_gateway.agents import AgentSpec, MemoryPolicy, load_agents
from runbus_model_router.scripted import ScriptedCall, ScriptedReply

SCRIPT = [
    ScriptedReply(tool_calls=[ScriptedCall("get_weather", {"city": "Sydney"})]),
    ScriptedReply(
        tool_calls=[
            ScriptedCall(
                "search_flights",
                {"origin": "Melbourne", "destination": "Sydney", "date": "2026-12-08"},
            )
        ]
    ),
    ScriptedReply(tool_calls=[ScriptedCall("create_booking", {"flight_id": "QF412-20261208"})]),
    ScriptedReply(text="Booked: {last_result}"),
]


def summary(name: str, samples_s: list[float]) -> tuple[float, float]:
    ms = [s * 1000 for s in samples_s]
    p50, p99 = statistics.median(ms), pct(ms, 0.99)
    print(f"  {name:<38} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   (n={len(ms)})")
    return p50, p99


def prompt(messages: int = 20) -> CompactRequest:
    return CompactRequest(
        messages=[
            ChatMessage(
                role="user" if i % 2 == 0 else "assistant",
                contents=[TextContent(text=f"message number {i} " * 8)],
                message_id=f"m{i}",
            )
            for i in range(messages)
        ]
    )


class EchoService(Service):
    """Replies with the prompt it got, as the compaction service would with nothing to do."""

    name = "bench_echo"

    def endpoints(self) -> list[Endpoint]:
        from runbus.messages import CompactResult
        from runbus.messages.compaction import COMPACT_REQUEST_DECODER

        async def echo(ctx: RunContext, request: CompactRequest) -> CompactResult:
            return CompactResult(
                messages=request.messages, groups=[], total_tokens=0, compacted=False
            )

        return [Endpoint("echo", "bench.echo.runbus", COMPACT_REQUEST_DECODER, echo)]


async def bench_hop(url: str, n: int) -> None:
    print(f"\n[hop] one request/reply, 20-message prompt body ({len(encode(prompt()))} bytes)")
    server_nc, client_nc = await nats.connect(url), await nats.connect(url)
    body = encode(prompt())
    reply_body = encode(
        __import__("runbus.messages", fromlist=["CompactResult"]).CompactResult(
            messages=prompt().messages, groups=[], total_tokens=0, compacted=False
        )
    )

    async def raw_handler(msg: Msg) -> None:
        await msg.respond(reply_body)

    await server_nc.subscribe("bench.echo.raw", queue="bench", cb=raw_handler)
    service = EchoService(server_nc, tracer_provider=create_tracer_provider("bench_echo"))
    await service.start()
    bus = Bus(client_nc, create_tracer_provider("bench_client").get_tracer("bench"))
    ctx = RunContext(
        run_id="r-bench",
        session_id="s1",
        agent="bench",
        props={"user_id": "alice", "tenant": "acme"},
        deadline=time.time() + 3600,
    )
    request = prompt()

    async def raw() -> None:
        await client_nc.request("bench.echo.raw", body, timeout=5)

    async def through_runbus() -> None:
        await bus.request("bench.echo.runbus", request, COMPACT_RESULT_DECODER, ctx=ctx)

    await timed(300, raw)
    await timed(300, through_runbus)
    raw_s, runbus_s = [], []
    for _ in range(5):  # interleave to share the machine's noise fairly
        raw_s += await timed(n // 5, raw)
        runbus_s += await timed(n // 5, through_runbus)
    raw_p50, raw_p99 = summary("raw nats-py request/reply", raw_s)
    rb_p50, rb_p99 = summary("runbus Bus.request + Service", runbus_s)
    print(f"  ratio runbus/raw: p50 {rb_p50 / raw_p50:.2f}x   p99 {rb_p99 / raw_p99:.2f}x")
    await service.stop()
    await server_nc.drain()
    await client_nc.drain()


class HopCounter(SpanProcessor):
    """Counts request/reply hops (client spans) and run-queue/event publishes per trace."""

    def __init__(self) -> None:
        self.clients: dict[int, int] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.kind is SpanKind.CLIENT and span.context is not None:
            tid = span.context.trace_id
            self.clients[tid] = self.clients.get(tid, 0) + 1


async def bench_run(url: str, n: int, in_flight: int, data_dir: Path) -> None:
    print("\n[run] scripted agent: 4 model calls + 3 tool calls, services in one process")
    travel = load_agents()["travel"]
    agent = AgentSpec(
        name="bench",
        instructions=travel.instructions,
        model="scripted/bench",
        tools=travel.tools,
        memory=MemoryPolicy(enabled=True, store_user_statements=True),
    )
    counter = HopCounter()
    async with start_stack(
        url,
        data_dir=data_dir,
        processor=counter,
        agents={"bench": agent},
        scripts={"bench": SCRIPT},
    ):
        nc = await nats.connect(url)
        client = RunbusClient(nc, token="dev-alice")
        counter_n = 0

        async def one() -> None:
            nonlocal counter_n
            counter_n += 1
            done = await client.run("bench", "Book it.", session_id=f"s-{counter_n}")
            assert "confirmation" in done.text, done.text

        await timed(30, one)
        counter.clients.clear()
        samples = await timed(n, one)
        summary("whole run, sequential", samples)
        hops = sorted(counter.clients.values())
        print(
            f"  bus request/reply hops per run: {hops[len(hops) // 2]} "
            "(+1 run-queue publish, + event publishes)"
        )

        async def burst(total: int) -> float:
            queue = asyncio.Semaphore(in_flight)

            async def guarded() -> None:
                async with queue:
                    await one()

            start, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(guarded() for _ in range(total)))
            wall = time.perf_counter() - start
            print(
                f"  (burst: this process used {100 * (time.process_time() - cpu) / wall:.0f}% "
                "of one core)"
            )
            return total / wall

        rate = await burst(n)
        print(f"  throughput, {in_flight} runs in flight: {rate:7.1f} runs/s")
        await nc.drain()


BENCH_AGENT = """
name = "bench"
instructions = "You are a travel assistant."
model = "scripted/bench"
tools = ["get_weather", "search_flights", "create_booking"]
[memory]
enabled = true
store_user_statements = true
"""

BENCH_SCRIPT = """
[[bench]]
tool_calls = [{name = "get_weather", arguments = {city = "Sydney"}}]
[[bench]]
tool_calls = [{name = "search_flights", arguments = {origin = "Melbourne", destination = "Sydney", date = "2026-12-08"}}]
[[bench]]
tool_calls = [{name = "create_booking", arguments = {flight_id = "QF412-20261208"}}]
[[bench]]
text = "Booked: {last_result}"
"""  # noqa: E501


async def bench_processes(n: int, in_flight: int, tmp: Path) -> None:
    """The deployment shape: six service processes (plus a second gateway) on both cores."""
    print("\n[run] same agent, services as separate processes (2 gateways), client here")
    (tmp / "agents").mkdir()
    (tmp / "agents" / "bench.toml").write_text(BENCH_AGENT)
    (tmp / "scripts.toml").write_text(BENCH_SCRIPT)
    settings = msgspec.structs.replace(
        load_settings(),
        data_dir=str(tmp / "pdata"),
        log_level="warning",
    )
    os.environ.update(
        {
            "RUNBUS_AGENTS_DIR": str(tmp / "agents"),
            "RUNBUS_MODEL_SCRIPTS": str(tmp / "scripts.toml"),
            "RUNBUS_LOG_LEVEL": "warning",
        }
    )
    stack = ProcessStack(settings, nats_port=0, replicas={"gateway": 2}, echo=None)
    url = await stack.start()
    try:
        nc = await nats.connect(url)
        client = RunbusClient(nc, token="dev-alice")
        count = 0

        async def one() -> None:
            nonlocal count
            count += 1
            done = await client.run("bench", "Book it.", session_id=f"p-{count}")
            assert "confirmation" in done.text, done.text

        await timed(30, one)
        summary("whole run, sequential", await timed(n, one))
        limit = asyncio.Semaphore(in_flight)

        async def guarded() -> None:
            async with limit:
                await one()

        start = time.perf_counter()
        await asyncio.gather(*(guarded() for _ in range(n)))
        rate = n / (time.perf_counter() - start)
        print(f"  throughput, {in_flight} runs in flight: {rate:7.1f} runs/s")
        await nc.drain()
    finally:
        await stack.stop()


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        print(f"runbus bench — nats-server {server.url}, uvloop, tracing on (no exporter)")
        if args.only in (None, "hop"):
            await bench_hop(server.url, args.hop_n)
        if args.only in (None, "run"):
            await bench_run(server.url, args.run_n, args.in_flight, Path(tmp) / "data")
    if args.only in (None, "processes"):
        with tempfile.TemporaryDirectory() as tmp:
            await bench_processes(args.run_n, args.in_flight, Path(tmp))
    for name in SECTIONS:
        if args.only in (None, name):
            module = importlib.import_module(f"bench.{name}")
            await module.run_benchmark()


SECTIONS = ("history", "compaction", "model_router", "tools", "memory")
"""Per-service benchmarks, each a module of this folder with `run_benchmark()`."""


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["hop", "run", "processes", *SECTIONS])
    parser.add_argument("--hop-n", type=int, default=3000)
    parser.add_argument("--run-n", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=64)
    uvloop.run(main(parser.parse_args()))
