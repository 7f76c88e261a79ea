"""Model router benchmark: what routing costs per call, against baselines measured in the same
run (the machine is shared and noisy, so only same-run ratios mean anything).

1. overhead in process: the scripted backend called directly vs the same call through
   `Router.complete` (plan, capability checks, budget check, guard, gen_ai span and metrics,
   usage record), with and without a budgeted tenant.
2. overhead over the bus: a raw nats-py request/reply and a runbus echo service (same bodies,
   same framing) vs `model.complete` through the router service (KV-backed ledger, spans on).
3. streaming: time to the first text delta when calling a backend that streams like a provider
   directly vs when a bus subscriber receives it as `run.text_delta` from the router service.
"""

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import nats
import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.timing import pct, timed
from runbus import subjects
from runbus.bus import Bus
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.logs import configure_logging
from runbus.messages import ChatMessage, ModelRequest, ModelResponse, TextContent, encode
from runbus.messages.model import MODEL_REQUEST_DECODER, MODEL_RESPONSE_DECODER
from runbus.service import Endpoint, Service, ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_examples.models import default_routes
from runbus_examples.scripted import ScriptedModel, ScriptedReply
from runbus_model_router.backends import OnDelta
from runbus_model_router.config import TargetConfig, parse_config
from runbus_model_router.core import Router
from runbus_model_router.middleware import Metrics, Tracing
from runbus_model_router.routing import Target, build_table
from runbus_model_router.service import ModelRouterService
from runbus_model_router.usage import MemoryLedger

REPLY = "It is 24 degrees and sunny in Sydney, with a light breeze from the sea."
SCRIPTS = {"bench": [ScriptedReply(text=REPLY)]}
BUDGETS = "[budgets.budgeted]\ntokens_per_day = 1000000000\n"
PLAIN = RunContext(run_id="r-bench", agent="bench", props={"tenant": "acme", "user_id": "alice"})
BUDGETED = RunContext(run_id="r-bench", agent="bench", props={"tenant": "budgeted"})


class MemoryProvenance:
    """The router's `Provenance` in a dict: the bench measures the router, not the ledger."""

    def __init__(self) -> None:
        self.known: dict[str, str] = {}

    def remember(self, message_id: str, family: str) -> None:
        self.known[message_id] = family

    async def families(self, message_ids: list[str]) -> dict[str, str]:
        return {m: self.known[m] for m in message_ids if m in self.known}


def summary(name: str, samples_s: list[float]) -> tuple[float, float]:
    us = [s * 1e6 for s in samples_s]
    p50, p99 = statistics.median(us), pct(us, 0.99)
    print(f"  {name:<46} p50 {p50:8.1f} µs   p99 {p99:8.1f} µs   (n={len(us)})")
    return p50, p99


async def interleaved(
    n: int, calls: dict[str, Callable[[], Awaitable[object]]]
) -> dict[str, list[float]]:
    """Warm each up, then alternate them in rounds so they share the machine's noise."""
    for call in calls.values():
        await timed(max(50, n // 10), call)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(10):
        for name, call in calls.items():
            samples[name] += await timed(n // 10, call)
    return samples


def prompt(stream_to: str | None = None) -> ModelRequest:
    history = [
        ChatMessage(
            role="user" if i % 2 == 0 else "assistant",
            contents=[TextContent(text=f"message number {i} " * 8)],
            message_id=f"m{i}",
        )
        for i in range(19)
    ]
    # The scripted backend answers reply N after N assistant messages since the last user one.
    history.append(ChatMessage(role="user", contents=[TextContent(text="Weather in Sydney?")]))
    return ModelRequest(
        route="scripted/bench", messages=history, stream_to=stream_to, message_id="r-bench-m0"
    )


async def ready(nc: NATS) -> None:
    """The connection's subscriptions are on the server: nats-py writes a flush's PING ahead of
    SUBs still in its buffer, so one PONG does not prove it; a second one does."""
    await nc.flush()
    await nc.flush()


async def no_delta(text: str) -> None:
    pass


def no_configured_backends(route: str, target: TargetConfig) -> Target:
    raise AssertionError(f"route {route!r} names backend {target.backend!r}; only built-ins here")


async def bench_in_process(n: int) -> None:
    print("\n[overhead in process] scripted backend, 20-message prompt, deltas discarded")
    routes = default_routes(SCRIPTS)
    table = build_table(routes, parse_config(BUDGETS), no_configured_backends)
    tracer = create_tracer_provider("bench_model_router").get_tracer("bench")
    router = Router(
        table,
        parse_config(BUDGETS),
        ledger=MemoryLedger(),
        provenance=MemoryProvenance(),
        middleware=[Tracing(tracer), Metrics()],
    )
    request = prompt()
    backend = routes["scripted/bench"]  # the router's own instance: both paths run the same

    samples = await interleaved(
        n,
        {
            "direct": lambda: backend.complete(request, no_delta),
            "router": lambda: router.complete(PLAIN, request, no_delta),
            "router, budgeted tenant": lambda: router.complete(BUDGETED, request, no_delta),
        },
    )
    direct = summary("backend.complete() directly", samples["direct"])
    routed = summary("Router.complete()", samples["router"])
    budgeted = summary(
        "Router.complete(), tenant with a budget", samples["router, budgeted tenant"]
    )
    print(
        f"  router overhead per call: p50 {routed[0] - direct[0]:.1f} µs, "
        f"p99 {routed[1] - direct[1]:.1f} µs; with a budget check p50 "
        f"{budgeted[0] - direct[0]:.1f} µs"
    )


class EchoService(Service):
    """Same framing as the router (decode a `model.complete`, reply a `model.response`), no
    routing: the baseline that isolates what the router adds to a runbus hop."""

    name = "bench_model_echo"

    def __init__(self, nc: NATS, reply: ModelResponse, options: ServiceOptions) -> None:
        super().__init__(nc, options=options)
        self.reply = reply

    def endpoints(self) -> list[Endpoint]:
        async def echo(ctx: RunContext, request: ModelRequest) -> ModelResponse:
            return self.reply

        return [Endpoint("echo", "bench.model.echo", MODEL_REQUEST_DECODER, echo)]


async def bench_over_the_bus(url: str, n: int) -> None:
    print("\n[overhead over the bus] model.complete request/reply, same bodies")
    server_nc, client_nc = await nats.connect(url), await nats.connect(url)
    service = ModelRouterService(
        server_nc,
        default_routes(SCRIPTS),
        config=parse_config(BUDGETS),
        options=ServiceOptions(tracer_provider=create_tracer_provider("model_router")),
    )
    await service.start()
    request = prompt()
    body = encode(request)
    reply = await ScriptedModel("bench", SCRIPTS["bench"]).complete(request, no_delta)
    reply_body = encode(reply)

    async def raw_echo(msg: Msg) -> None:
        await msg.respond(reply_body)

    await server_nc.subscribe("bench.model.raw", queue="bench", cb=raw_echo)
    echo = EchoService(
        server_nc, reply, ServiceOptions(tracer_provider=create_tracer_provider("bench_echo"))
    )
    await echo.start()
    await ready(server_nc)
    bus = Bus(client_nc, create_tracer_provider("bench_client").get_tracer("bench"))

    async def raw() -> None:
        await client_nc.request("bench.model.raw", body, timeout=5)

    async def framed() -> None:
        await bus.request("bench.model.echo", request, MODEL_RESPONSE_DECODER, ctx=PLAIN)

    async def routed(ctx: RunContext) -> None:
        await bus.request(subjects.MODEL_COMPLETE, request, MODEL_RESPONSE_DECODER, ctx=ctx)

    samples = await interleaved(
        n,
        {
            "raw": raw,
            "echo": framed,
            "router": lambda: routed(PLAIN),
            "budgeted": lambda: routed(BUDGETED),
        },
    )
    summary("raw nats-py request/reply (echo)", samples["raw"])
    echo_p = summary("runbus Bus.request + Service (echo)", samples["echo"])
    routed_p = summary("model.complete through the router service", samples["router"])
    budget_p = summary("  … tenant with a budget", samples["budgeted"])
    print(
        f"  router over a runbus echo hop: p50 +{routed_p[0] - echo_p[0]:.1f} µs "
        f"({routed_p[0] / echo_p[0]:.2f}x), p99 +{routed_p[1] - echo_p[1]:.1f} µs; "
        f"the budget check adds p50 {budget_p[0] - routed_p[0]:.1f} µs"
    )
    await echo.stop()
    await service.stop()
    await server_nc.drain()
    await client_nc.drain()


class PacedModel:
    """The scripted reply written the way a provider streams it: a short wait before each word,
    so the event loop gets to send every delta as it is made."""

    name = "paced"

    def __init__(self, gap: float) -> None:
        self.gap = gap

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        words = REPLY.split(" ")
        for index, word in enumerate(words):
            await asyncio.sleep(self.gap)
            await on_delta(word if index == len(words) - 1 else f"{word} ")
        return ModelResponse(
            message=ChatMessage(role="assistant", contents=[TextContent(text=REPLY)]),
            model="paced",
            finish_reason="stop",
        )


async def bench_first_delta(url: str, n: int) -> dict[str, dict[str, float]]:
    gap = 0.002
    print(
        f"\n[streaming] time to the first text delta; the provider writes a word "
        f"every {gap * 1000:g} ms"
    )
    server_nc, client_nc = await nats.connect(url), await nats.connect(url)
    paced = PacedModel(gap)
    service = ModelRouterService(
        server_nc,
        {"paced": paced},
        options=ServiceOptions(tracer_provider=create_tracer_provider("model_router")),
    )
    await service.start()
    await ready(server_nc)
    stream_to = subjects.events("acme", "alice", "r-bench")
    request = msgspec.structs.replace(prompt(stream_to), route="paced")
    bus = Bus(client_nc, create_tracer_provider("bench_client").get_tracer("bench"))
    first: asyncio.Future[float] | None = None

    async def on_event(msg: Msg) -> None:
        if first is not None and not first.done():
            first.set_result(time.perf_counter())

    await client_nc.subscribe(stream_to, cb=on_event)
    await ready(client_nc)

    async def direct() -> float:
        start = time.perf_counter()
        seen: list[float] = []

        async def on_delta(text: str) -> None:
            if not seen:
                seen.append(time.perf_counter())

        await paced.complete(request, on_delta)
        return seen[0] - start

    async def over_bus() -> float:
        nonlocal first
        first = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        await bus.request(subjects.MODEL_COMPLETE, request, MODEL_RESPONSE_DECODER, ctx=PLAIN)
        return await first - start

    for _ in range(20):
        await direct()
        await over_bus()
    direct_s: list[float] = []
    bus_s: list[float] = []
    for _ in range(n):
        direct_s.append(await direct())
        bus_s.append(await over_bus())
    d = summary("first delta, backend called directly", direct_s)
    b = summary("first run.text_delta at a bus subscriber", bus_s)
    print(f"  added by the router and the bus: p50 {b[0] - d[0]:.1f} µs, p99 {b[1] - d[1]:.1f} µs")
    await service.stop()
    await server_nc.drain()
    await client_nc.drain()
    return {
        "direct": {"p50_us": d[0], "p99_us": d[1], "n": n},
        "bus": {"p50_us": b[0], "p99_us": b[1], "n": n},
    }


async def run_benchmark(n: int = 3000) -> dict[str, dict[str, dict[str, float]]]:
    configure_logging("warning")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        print(f"runbus model router bench — nats-server {server.url}, tracing on (no exporter)")
        await bench_in_process(n)
        await bench_over_the_bus(server.url, n)
        return {"streaming": await bench_first_delta(server.url, n // 10)}


if __name__ == "__main__":
    uvloop.run(run_benchmark())
