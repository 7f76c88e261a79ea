"""Tool executor benchmark, against baselines measured in the same run (the machine is shared and
noisy, so only same-run ratios mean anything).

1. per-call overhead: a trivial async tool called directly vs `Tool.invoke` (validation,
   injection, result cap) vs `Executor.invoke` with a three-middleware chain vs a raw nats-py
   request/reply vs `runbus.tools.<name>.invoke` through the service (spans on, no exporter),
   and a side-effecting tool through the service (JetStream KV `started` + `done` records).
2. scaling: a 50 ms I/O-bound tool, 128 calls in flight, served by 1, 2 and 4 replicas that
   each run at most 16 calls at once (`max_concurrency=16`): calls/s against the ideal
   replicas * 16 / 50 ms. Replicas are in-process on their own connections, so the curve shows
   queue-group load sharing, not extra CPUs.
"""

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import SectionNumbers, ToolScalingPoint
from runbus import ops, subjects
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.messages import encode
from runbus.messages.tools import ToolInvoke
from runbus.service import ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_examples.travel import corporate_policy
from runbus_tool_executor.calls import MemoryCallStore
from runbus_tool_executor.executor import Executor
from runbus_tool_executor.middleware import PROCEED, Call, Decision, Reject
from runbus_tool_executor.registry import FromProp, ToolRegistry
from runbus_tool_executor.service import ToolExecutorService

CTX = RunContext(
    run_id="r-bench",
    session_id="s-bench",
    agent="bench",
    props={"user_id": "alice", "tenant": "acme", "request_id": "q-1"},
)
N_OVERHEAD = 2000
IN_FLIGHT = 128
SLOTS = 16
IO_SECONDS = 0.05

bench_tools = ToolRegistry()


@bench_tools.tool()
async def echo(text: str) -> str:
    """Echo (the baseline tool)."""
    return text


@bench_tools.tool(side_effect=True)
async def record(text: str) -> str:
    """Echo, recorded as a side effect."""
    return text


@bench_tools.tool(timeout=5.0)
async def io_50ms(n: int) -> int:
    """Waits 50 ms, like a call to a remote API."""
    await asyncio.sleep(IO_SECONDS)
    return n


# The injected-identity variant of echo, so `Tool.invoke` does its whole job.
injected_tools = ToolRegistry()


@injected_tools.tool()
async def whoami(text: str, user_id: Annotated[str, FromProp("user_id")]) -> str:
    """Echo with the trusted user."""
    return f"{text}:{user_id}"


def tenant_guard(call: Call) -> Decision:
    return PROCEED if call.run.prop("tenant") else Reject(error="no tenant")


def size_guard(call: Call) -> Decision:
    return PROCEED if len(str(call.arguments)) < 10_000 else Reject(error="too big")


CHAIN = [tenant_guard, corporate_policy(), size_guard]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(name: str, samples_s: list[float], baseline_us: float | None = None) -> float:
    us = [s * 1e6 for s in samples_s]
    p50, p99 = statistics.median(us), pct(us, 0.99)
    extra = f"   +{p50 - baseline_us:8.1f} µs over direct" if baseline_us is not None else ""
    print(f"  {name:<46} p50 {p50:8.1f} µs   p99 {p99:8.1f} µs{extra}")
    return p50


async def timed(n: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(min(200, n)):
        await call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def replica(url: str, registry: ToolRegistry, **kwargs: Any) -> tuple[NATS, Any]:
    nc = await nats.connect(url)
    service = ToolExecutorService(
        nc,
        [registry],
        middleware=CHAIN,
        options=ServiceOptions(tracer_provider=create_tracer_provider("tool_executor"), **kwargs),
    )
    await service.start()
    await nc.flush()
    return nc, service


async def request(nc: NATS, name: str, arguments: dict[str, Any], call_id: str) -> Any:
    body = encode(ToolInvoke(call_id=call_id, name=name, arguments=arguments))
    for _ in range(100):
        try:
            reply = await nc.request(
                subjects.tool_invoke(name), body, timeout=10, headers=CTX.to_headers()
            )
            return ops.TOOL_INVOKE.family.decode_reply.decode(reply.data)
        except nats.errors.NoRespondersError:
            await asyncio.sleep(0.01)
    raise RuntimeError(f"nobody serves {name}")


async def bench_overhead(url: str) -> None:
    print(f"\n[overhead] one call of a trivial async tool (n={N_OVERHEAD}, sequential)")
    tool = injected_tools.tools["whoami"]
    executor = Executor(middleware=CHAIN, calls=MemoryCallStore())
    request_body = ToolInvoke(call_id="c1", name="whoami", arguments={"text": "hi"})
    direct = summary(
        "function called directly", await timed(N_OVERHEAD, lambda: whoami("hi", "alice"))
    )
    summary(
        "Tool.invoke (validate, inject, cap)",
        await timed(N_OVERHEAD, lambda: tool.invoke("c1", {"text": "hi"}, CTX)),
        direct,
    )
    summary(
        "Executor.invoke (+ 3 middleware, span)",
        await timed(N_OVERHEAD, lambda: executor.invoke(tool, request_body, CTX)),
        direct,
    )

    server, client = await nats.connect(url), await nats.connect(url)

    async def raw_echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await server.subscribe("bench.raw", queue="bench", cb=raw_echo)
    await server.flush()
    body = encode(request_body)
    summary(
        "raw nats-py request/reply (same body)",
        await timed(N_OVERHEAD, lambda: client.request("bench.raw", body, timeout=5)),
        direct,
    )
    nc, service = await replica(url, bench_tools)
    count = iter(range(10**9))
    summary(
        "runbus.tools.echo.invoke through the service",
        await timed(N_OVERHEAD, lambda: request(client, "echo", {"text": "hi"}, "c1")),
        direct,
    )
    summary(
        "side-effecting tool (KV started + done)",
        await timed(
            N_OVERHEAD // 4, lambda: request(client, "record", {"text": "hi"}, f"c{next(count)}")
        ),
        direct,
    )
    summary(
        "same call id again (recorded result replayed)",
        await timed(N_OVERHEAD // 4, lambda: request(client, "record", {"text": "hi"}, "c0")),
        direct,
    )
    await service.stop()
    for connection in (nc, server, client):
        await connection.drain()


async def bench_scaling(url: str) -> list[ToolScalingPoint]:
    print(
        f"\n[scaling] 50 ms I/O tool, {IN_FLIGHT} calls in flight, "
        f"{SLOTS} concurrent calls per replica"
    )
    client = await nats.connect(url)
    points = [await scaling_point(url, client, replicas) for replicas in (1, 2, 4)]
    await client.drain()
    return points


async def scaling_point(url: str, client: NATS, replicas: int) -> ToolScalingPoint:
    started = [await replica(url, bench_tools, max_concurrency=SLOTS) for _ in range(replicas)]
    total = 20 * SLOTS * replicas
    gate = asyncio.Semaphore(IN_FLIGHT)
    latencies: list[float] = []

    async def one(i: int) -> None:
        async with gate:
            start = time.perf_counter()
            reply = await request(client, "io_50ms", {"n": i}, f"c{i}")
            assert reply.result.error is None, reply.result.error
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(one(i) for i in range(SLOTS)))  # every replica is listening
    latencies.clear()
    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(total)))
    elapsed = time.perf_counter() - start
    ideal = replicas * SLOTS / IO_SECONDS
    print(
        f"  {replicas} replica(s): {total / elapsed:7.0f} calls/s "
        f"(ideal {ideal:5.0f}, {total / elapsed / ideal:4.0%})   "
        f"p50 {statistics.median(latencies) * 1000:6.1f} ms   "
        f"p99 {pct(latencies, 0.99) * 1000:6.1f} ms   (n={total})"
    )
    for nc, service in started:
        await service.stop()
        await nc.drain()
    return ToolScalingPoint(
        replicas=replicas,
        calls_per_s=total / elapsed,
        ideal=ideal,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=pct(latencies, 0.99) * 1000,
        calls=total,
    )


async def run_benchmark() -> SectionNumbers:
    print("tool executor bench")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        await bench_overhead(server.url)
        return SectionNumbers(tool_scaling=await bench_scaling(server.url))


if __name__ == "__main__":
    import uvloop

    from runbus.logs import configure_logging

    configure_logging("warning")
    uvloop.run(run_benchmark())
