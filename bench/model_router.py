"""Model router benchmark: what routing costs per call, against baselines measured in the same
run (the machine is shared and noisy, so only same-run ratios mean anything).

1. overhead in process: the scripted backend called directly vs the same call through
   `Router.complete` (plan, capability checks, budget check, guard, gen_ai span and metrics,
   usage record), with and without a budgeted tenant.
2. overhead over the bus: a raw nats-py request/reply and a runbus echo service (same bodies,
   same framing) vs `model.complete` through the router service (KV-backed ledger, spans on).
3. streaming: time to the first text delta when calling a backend that streams like a provider
   directly vs when a bus subscriber receives it as `run.text_delta` from the router service.
4. provider CPU: the router's CPU per model call against a loopback OpenAI-compatible server
   in its own process (token-sized chunks, a run's 4 calls), the OpenAI-compatible backend as
   it is (msgspec over aiohttp) vs the same calls through the openai SDK's typed layer (the
   path it replaced, kept here only as the baseline), rounds alternated, medians.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import nats
import uvloop
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loopback_model import reply_for, server_process
from bench.results import FirstDelta, ProviderCpu, SectionNumbers, Streaming
from bench.timing import pct, timed
from runbus import ops, subjects
from runbus.bus import Bus
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.logs import configure_logging
from runbus.messages import (
    ChatMessage,
    FunctionResultContent,
    ModelRequest,
    ModelResponse,
    TextContent,
    ToolSpec,
    Usage,
    encode,
)
from runbus.service import Endpoint, Service, ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_examples.models import default_routes
from runbus_examples.scripted import ScriptedModel, ScriptedReply
from runbus_model_router.backends import OnDelta
from runbus_model_router.config import BackendConfig, TargetConfig, parse_config
from runbus_model_router.core import Router
from runbus_model_router.middleware import Metrics, Tracing
from runbus_model_router.openai_chat import OpenAIChatModel, open_client
from runbus_model_router.openai_wire import StreamAssembler, _PartialCall
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

        return [Endpoint("echo", "bench.model.echo", ops.MODEL_COMPLETE.decode, echo)]


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
        await bus.request("bench.model.echo", request, ops.MODEL_COMPLETE.decode_reply, ctx=PLAIN)

    async def routed(ctx: RunContext) -> None:
        await bus.request(
            subjects.MODEL_COMPLETE, request, ops.MODEL_COMPLETE.decode_reply, ctx=ctx
        )

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


async def bench_first_delta(url: str, n: int) -> Streaming:
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
        await bus.request(
            subjects.MODEL_COMPLETE, request, ops.MODEL_COMPLETE.decode_reply, ctx=PLAIN
        )
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
    return Streaming(
        direct=FirstDelta(p50_us=d[0], p99_us=d[1], n=n),
        bus=FirstDelta(p50_us=b[0], p99_us=b[1], n=n),
    )


# -- 4. provider CPU ------------------------------------------------------------------------

BENCH_TOOLS = [
    ToolSpec(
        name=name,
        description=f"The travel tool {name}",
        parameters={"type": "object", "properties": {key: {"type": "string"} for key in keys}},
    )
    for name, keys in (
        ("get_weather", ["city"]),
        ("search_flights", ["origin", "destination", "date"]),
        ("create_booking", ["flight_id"]),
    )
]
BOOKING = (
    "Booking QF412-20261208 is confirmed: Melbourne to Sydney on 8 December 2026, departing "
    "09:05 from terminal 1 and arriving 10:30, one adult in economy with 23 kg of checked "
    "baggage, seat 14C, total AUD 189.00 charged to the card ending 4242; the e-ticket and the "
    "receipt were sent to the address on file."
)
ARGUMENT_FRAGMENT = 4
"""Characters of tool-call arguments per streamed chunk, about a token each, as providers do."""


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _token_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "bench-tokens",
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


async def _token_completions(request: Any) -> Any:
    from aiohttp import web

    body = await request.json()
    message = reply_for(body.get("messages", []))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    out = [_sse(_token_chunk({"role": "assistant", "content": ""}))]
    if calls := message.get("tool_calls"):
        for index, call in enumerate(calls):
            head = {"id": call["id"], "type": "function"}
            function = {"name": call["function"]["name"], "arguments": ""}
            out.append(
                _sse(_token_chunk({"tool_calls": [{"index": index, **head, "function": function}]}))
            )
            arguments = call["function"]["arguments"]
            for at in range(0, len(arguments), ARGUMENT_FRAGMENT):
                piece = {"arguments": arguments[at : at + ARGUMENT_FRAGMENT]}
                out.append(
                    _sse(_token_chunk({"tool_calls": [{"index": index, "function": piece}]}))
                )
        finish = "tool_calls"
    else:
        words = message["content"].split(" ")
        out += [_sse(_token_chunk({"content": f" {w}" if i else w})) for i, w in enumerate(words)]
        finish = "stop"
    out.append(_sse(_token_chunk({}, finish)))
    usage = {"prompt_tokens": 100, "completion_tokens": len(out), "total_tokens": 100 + len(out)}
    out.append(_sse({**_token_chunk({}), "choices": [], "usage": usage}))
    out.append(b"data: [DONE]\n\n")
    for event in out:  # one write per chunk: each its own read on the router's side
        await response.write(event)
    await response.write_eof()
    return response


async def serve_tokens() -> None:
    """The token-streaming loopback server (`python -m bench.model_router --serve`): the bench
    run's 4 replies (bench/loopback_model.py's script) in token-sized chunks, no latency."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", _token_completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"port {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


class SdkAssembler(StreamAssembler):
    """The assembler as it read the openai SDK's pydantic chunks."""

    def feed(self, chunk: Any) -> str:
        self.model = chunk.model or self.model
        self.response_id = chunk.id or self.response_id
        if chunk.usage is not None:
            self.usage = Usage(
                input_tokens=chunk.usage.prompt_tokens,
                output_tokens=chunk.usage.completion_tokens,
            )
        delta_text = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if choice.finish_reason:
                self.finish = choice.finish_reason
            if delta.content:
                delta_text += delta.content
            extra = delta.model_extra or {}
            for name in ("reasoning_content", "reasoning"):
                if isinstance(piece := extra.get(name), str):
                    self.reasoning.append(piece)
                    break
            for call in delta.tool_calls or []:
                partial = self.calls.setdefault(call.index, _PartialCall())
                partial.call_id = call.id or partial.call_id
                if call.function is not None:
                    partial.name += call.function.name or ""
                    partial.arguments.append(call.function.arguments or "")
        if delta_text:
            self.text.append(delta_text)
        return delta_text


class SdkChatModel(OpenAIChatModel):
    """The baseline: the same request through the openai SDK (`AsyncOpenAI`, retries off), its
    stream of pydantic chunks read as the backend used to, before msgspec over its own HTTP."""

    def __init__(self, sdk: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sdk = sdk

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        assembler = SdkAssembler()
        params = self._params(request)
        stream = await self.sdk.chat.completions.create(**params, timeout=self.timeout)
        async with stream:
            async for chunk in stream:
                if text := assembler.feed(chunk):
                    await on_delta(text)
        reply = assembler.result()
        message = ChatMessage(
            role="assistant", contents=reply.contents, created_at=datetime.now(UTC)
        )
        return ModelResponse(
            message=message,
            model=reply.model or self.model,
            finish_reason=reply.finish_reason,
            usage=reply.usage or Usage(),
        )


def _router_for(backend: Any) -> Router:
    """A router whose route `bench` is `backend`, with the service's spans and metrics."""
    config = parse_config("")
    table = build_table({"bench": backend}, config, no_configured_backends)
    tracer = create_tracer_provider("bench_model_router").get_tracer("bench")
    return Router(
        table,
        config,
        ledger=MemoryLedger(),
        provenance=MemoryProvenance(),
        middleware=[Tracing(tracer), Metrics()],
    )


async def _one_run(router: Router) -> int:
    """A run's 4 model calls (3 tool calls, then the answer); the text deltas seen."""
    deltas = 0

    async def on_delta(text: str) -> None:
        nonlocal deltas
        deltas += 1

    messages = [
        ChatMessage(role="system", contents=[TextContent(text="You are a travel assistant.")]),
        ChatMessage(role="user", contents=[TextContent(text="Book me a flight to Sydney.")]),
    ]
    for _ in range(4):
        request = ModelRequest(route="bench", messages=messages, tools=BENCH_TOOLS)
        response = await router.complete(PLAIN, request, on_delta)
        messages.append(response.message)
        calls = response.message.function_calls
        if not calls:
            break
        results = [FunctionResultContent(call_id=c.call_id, result=BOOKING) for c in calls]
        messages.append(ChatMessage(role="tool", contents=list(results)))
    return deltas


async def bench_provider_cpu(runs_per_round: int, rounds: int = 5) -> dict[str, ProviderCpu]:
    print(
        "\n[provider CPU] router CPU per model call (Router.complete with spans and metrics) "
        "against a loopback OpenAI-compatible server in its own process, a run's 4 calls"
    )
    servers = {
        "token_chunks": ("token-sized chunks", ("bench.model_router", "--serve")),
        "whole_replies": (
            "each reply in one chunk (bench/loopback_model.py)",
            ("bench.loopback_model", "--latency", "0"),
        ),
    }
    results: dict[str, ProviderCpu] = {}
    for key, (label, command) in servers.items():
        with server_process(*command) as server:
            print(f"  {label}:")
            results[key] = await _provider_cpu(server.url, runs_per_round, rounds)
    return results


async def _provider_cpu(url: str, runs_per_round: int, rounds: int) -> ProviderCpu:
    import openai

    backend = BackendConfig(base_url=url, max_tokens_param="max_tokens")
    endpoint = open_client("bench", backend)
    sdk = openai.AsyncOpenAI(api_key="not-needed", base_url=url, max_retries=0)
    common: dict[str, Any] = {"model": "bench-tokens", "config": backend, "timeout": 60.0}
    routers = {
        "msgspec": _router_for(OpenAIChatModel(endpoint, **common)),
        "sdk": _router_for(SdkChatModel(sdk, client=endpoint, **common)),
    }
    deltas = {name: await _one_run(router) for name, router in routers.items()}
    assert deltas["msgspec"] == deltas["sdk"] > 0, deltas
    for router in routers.values():  # warm: connections, imports, caches
        for _ in range(max(3, runs_per_round // 3)):
            await _one_run(router)
    cpu: dict[str, list[float]] = {name: [] for name in routers}
    wall: dict[str, list[float]] = {name: [] for name in routers}
    calls = runs_per_round * 4
    for index in range(rounds):
        order = list(routers) if index % 2 == 0 else list(reversed(routers))
        for name in order:
            start_cpu, start = time.process_time(), time.perf_counter()
            for _ in range(runs_per_round):
                await _one_run(routers[name])
            cpu[name].append((time.process_time() - start_cpu) / calls * 1e6)
            wall[name].append((time.perf_counter() - start) / calls * 1e6)
    await endpoint.close()
    await sdk.close()
    medians = {name: statistics.median(samples) for name, samples in cpu.items()}
    for name, label in (("sdk", "openai SDK (the baseline)"), ("msgspec", "msgspec over aiohttp")):
        print(
            f"    {label:<26} CPU {medians[name]:7.1f} µs/call   wall "
            f"{statistics.median(wall[name]):7.1f} µs/call   rounds "
            + " ".join(f"{v:.0f}" for v in cpu[name])
        )
    ratio = medians["msgspec"] / medians["sdk"]
    print(
        f"    msgspec/SDK CPU per call: {ratio:.2f}x, "
        f"{(medians['sdk'] - medians['msgspec']) * 4 / 1000:.2f} ms less per run of 4 calls "
        f"({rounds} rounds x {calls} calls each, {deltas['msgspec']} text deltas per run)"
    )
    return ProviderCpu(
        cpu_us_per_call=medians,
        cpu_us_rounds=cpu,
        ratio_msgspec_over_sdk=ratio,
        calls_per_round=calls,
        rounds=rounds,
    )


async def run_benchmark(n: int = 3000) -> SectionNumbers:
    configure_logging("warning")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        print(f"runbus model router bench — nats-server {server.url}, tracing on (no exporter)")
        await bench_in_process(n)
        await bench_over_the_bus(server.url, n)
        streaming = await bench_first_delta(server.url, n // 10)
    provider = await bench_provider_cpu(max(10, n // 100))
    return SectionNumbers(streaming=streaming, model_router_provider_cpu=provider)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.model_router")
    parser.add_argument("--serve", action="store_true", help="be the token-streaming server")
    parser.add_argument(
        "--provider-cpu", type=int, metavar="RUNS", help="only section 4, RUNS runs a round"
    )
    args = parser.parse_args()
    if args.serve:
        uvloop.run(serve_tokens())
    elif args.provider_cpu:
        configure_logging("warning")
        uvloop.run(bench_provider_cpu(args.provider_cpu))
    else:
        uvloop.run(run_benchmark())
