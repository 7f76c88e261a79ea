"""runbus benchmarks (`make bench`; `--quick` for a 1-2 minute smoke). Every comparison is
measured in this one process run, against a baseline of the same run, because the machine is
shared and noisy; the sections fill in bench/results.py's records and bench/report/ writes
results.json, results.md and the plots from them.

1. floor: raw nats-py request/reply and JetStream publish on the same server.
2. hop: the same round trip through runbus's `Bus.request` and `Service` base (msgspec body,
   run headers, trace context, spans on).
3. whole run: a scripted agent making 4 model calls and 3 tool calls, the services in one
   process (hops per run) and as separate processes (latency, CPU of every process), next to
   the same agent in process on Microsoft Agent Framework (bench/maf.py).
4. throughput at 1/8/64 clients x 1/2 gateways; tool_executor scaling (bench/tools.py).
5. streaming first delta (bench/model_router.py); resume of a run whose gateway was killed.
6. the durable anchors: the same run on LangGraph with its in-memory, SQLite and Postgres
   savers (bench/anchors.py); a 300 ms model at 1/64/256/1000 runs in flight next to LangGraph
   (bench/slow_model.py), and where one run's time beyond the 300 ms calls goes
   (bench/overhead.py); run cost against session length, with and without persisted
   compaction (bench/session_length.py).
7. the per-service sections: history, compaction, model_router, tools, memory, memory_eval (store
   precision/recall and recall@k on the labelled set); mcp_tool (a run
   calling an MCP stdio tool vs a native one), held_deltas (text held for output guardrails) and
   child_run (a run calling another agent as a tool vs a native tool).

`--targets` runs only what the targets are judged from (TARGET_SECTIONS); `--sections a,b` or
`--only a` any subset. A run of some sections writes its report to PARTIAL_RESULTS unless
`--results-dir` says otherwise, so bench/results/ always holds a full run.
"""

import argparse
import asyncio
import collections
import contextlib
import gc
import importlib
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import nats
import uvloop
from nats.aio.msg import Msg
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.stack import start_stack

from bench import (
    anchors,
    maf,
    overhead,
    profile,
    report,
    resume,
    session_length,
    slow_model,
    whole_run,
)
from bench.processes import OPEN_BUS_ALICE, REPO, process_stack
from bench.results import (
    Floor,
    Hop,
    InProcessRun,
    Latency,
    Machine,
    Maf,
    Meta,
    Results,
    SectionNumbers,
    WholeRun,
)
from bench.timing import pct, timed
from runbus import ops, subjects
from runbus.bus import Bus
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.logs import configure_logging
from runbus.messages import ChatMessage, CompactRequest, CompactResult, TextContent, encode
from runbus.service import Endpoint, Service, ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_examples import AGENTS_DIR
from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_gateway.agents import AgentSpec, MemoryPolicy, load_agents

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

        async def echo(ctx: RunContext, request: CompactRequest) -> CompactResult:
            return CompactResult(
                messages=request.messages, groups=[], total_tokens=0, compacted=False
            )

        return [Endpoint("echo", "bench.echo.runbus", ops.COMPACTION_COMPACT.decode, echo)]


async def bench_hop(url: str, n: int) -> tuple[Floor, Hop]:
    """The physical floor (raw request/reply, JetStream publish) and one runbus hop."""
    print(f"\n[hop] one request/reply, 20-message prompt body ({len(encode(prompt()))} bytes)")
    server_nc, client_nc = await nats.connect(url), await nats.connect(url)
    body = encode(prompt())
    reply_body = encode(
        CompactResult(messages=prompt().messages, groups=[], total_tokens=0, compacted=False)
    )

    async def raw_handler(msg: Msg) -> None:
        await msg.respond(reply_body)

    await server_nc.subscribe("bench.echo.raw", queue="bench", cb=raw_handler)
    service = EchoService(
        server_nc, options=ServiceOptions(tracer_provider=create_tracer_provider("bench_echo"))
    )
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
    js = client_nc.jetstream()
    await js.add_stream(name="BENCH_FLOOR", subjects=["bench.floor.>"], max_msgs=10_000)
    event = encode(prompt(1))  # about the size of a run event

    async def raw() -> None:
        await client_nc.request("bench.echo.raw", body, timeout=5)

    async def js_publish() -> None:
        await js.publish("bench.floor.events", event)

    async def through_runbus() -> None:
        await bus.request(
            "bench.echo.runbus", request, ops.COMPACTION_COMPACT.decode_reply, ctx=ctx
        )

    calls = {"raw": raw, "js": js_publish, "runbus": through_runbus}
    for call in calls.values():
        await timed(300, call)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(5):  # interleave to share the machine's noise fairly
        for name, call in calls.items():
            samples[name] += await timed(n // 5, call)
    raw_p = summary("raw nats-py request/reply (floor)", samples["raw"])
    js_p = summary(f"raw JetStream publish, {len(event)} B (floor)", samples["js"])
    rb_p = summary("runbus Bus.request + Service", samples["runbus"])
    print(f"  ratio runbus/raw: p50 {rb_p[0] / raw_p[0]:.2f}x   p99 {rb_p[1] / raw_p[1]:.2f}x")
    await service.stop()
    await server_nc.drain()
    await client_nc.drain()
    floor = Floor(request_reply=point(raw_p, n), js_publish=point(js_p, n))
    return floor, Hop(runbus=point(rb_p, n))


def point(p50_p99: tuple[float, float], n: int) -> Latency:
    return Latency(p50_ms=p50_p99[0], p99_ms=p50_p99[1], n=n)


class HopCounter(SpanProcessor):
    """Counts, per trace, the request/reply hops (the bus's `send …` client spans) and the
    publishes (producer spans: run events)."""

    def __init__(self) -> None:
        self.hops: dict[int, int] = {}
        self.publishes: dict[int, int] = {}
        self.names: collections.Counter[str] = collections.Counter()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is None:
            return
        tid = span.context.trace_id
        self.names[f"{span.kind.name} {span.name}"] += 1
        if span.kind is SpanKind.CLIENT and span.name.startswith("send "):
            self.hops[tid] = self.hops.get(tid, 0) + 1
        elif span.kind is SpanKind.PRODUCER:
            self.publishes[tid] = self.publishes.get(tid, 0) + 1

    def clear(self) -> None:
        self.hops.clear()
        self.publishes.clear()
        self.names.clear()


async def bench_run(url: str, n: int, in_flight: int, data_dir: Path) -> InProcessRun:
    """The whole run with the six services in this process: latency, hops, CPU, runs/s."""
    print("\n[run] scripted agent: 4 model calls + 3 tool calls, services in one process")
    travel = load_agents(AGENTS_DIR)["travel"]
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
        client = RunbusClient(nc, token="dev-alice", identity=OPEN_BUS_ALICE)
        counter_n = 0

        async def one() -> None:
            nonlocal counter_n
            counter_n += 1
            done = await client.run("bench", "Book it.", session_id=f"s-{counter_n}")
            assert "confirmation" in done.text, done.text

        await timed(30, one)
        await asyncio.sleep(0.2)  # the last run's root span ends after its ack
        counter.clear()
        js = nc.jetstream()
        stored = (await js.stream_info(subjects.EVENTS_STREAM)).state.messages
        cpu = time.process_time()
        samples = await timed(n, one)
        cpu_ms = (time.process_time() - cpu) * 1000 / n
        p50_p99 = summary("whole run, sequential", samples)
        events = ((await js.stream_info(subjects.EVENTS_STREAM)).state.messages - stored) / n
        await asyncio.sleep(0.2)
        # A run with no span of a kind (events published without one) counts zero of it.
        hops = statistics.median_low(counter.hops.values()) if counter.hops else 0
        publishes = statistics.median_low(counter.publishes.values()) if counter.publishes else 0
        spans = {name: count / n for name, count in sorted(counter.names.items())}
        print(
            f"  per run: {hops} bus request/reply hops, {events:g} run events (JetStream), "
            f"{publishes} other publishes, {cpu_ms:.2f} ms CPU (all services and the client)"
        )
        limit = asyncio.Semaphore(in_flight)

        async def guarded() -> None:
            async with limit:
                await one()

        start = time.perf_counter()
        await asyncio.gather(*(guarded() for _ in range(n)))
        rate = n / (time.perf_counter() - start)
        print(f"  throughput, {in_flight} runs in flight: {rate:7.1f} runs/s")
        await nc.drain()
    return InProcessRun(
        p50_ms=p50_p99[0],
        p99_ms=p50_p99[1],
        n=n,
        hops_per_run=hops,
        events_per_run=events,
        publishes_per_run=publishes,
        spans_per_run=spans,
        cpu_ms_per_run=cpu_ms,
        runs_per_s={str(in_flight): rate},
    )


async def bench_maf(n: int, levels: tuple[int, ...], trials: int) -> Maf:
    print("\n[maf] the same agent in process on Microsoft Agent Framework (the anchor)")
    result = await maf.measure(n, levels, trials)
    print(
        f"  whole run, sequential                  p50 {result.p50_ms:7.3f} ms   "
        f"p99 {result.p99_ms:7.3f} ms   (n={n}; 3 tool calls checked per run)"
    )
    print(
        f"  CPU per run {result.cpu_ms_per_run:.2f} ms;  runs/s by clients: "
        + ", ".join(f"{c}: {r:.0f}" for c, r in result.runs_per_s.items())
    )
    return result


async def bench_processes(args: argparse.Namespace, results: Results) -> None:
    """The deployment shape: each service its own process, gateways added and killed here."""
    print("\n[processes] the same agent, six services as separate processes, client here")
    whole = results.whole_run = results.whole_run or WholeRun()
    async with process_stack(gateways=1) as stack:
        clients = await whole_run.Clients.open(stack.url)
        try:
            run = await whole_run.sequential(stack, clients, args.run_n)
            cpu = run.cpu_ms_per_run
            print(
                f"  whole run, sequential, 1 gateway       p50 {run.p50_ms:7.3f} ms   "
                f"p99 {run.p99_ms:7.3f} ms   (n={args.run_n})\n"
                f"  CPU per run: services {cpu.services:.2f} ms + nats-server "
                f"{cpu.nats_server:.2f} ms + client {cpu.client:.2f} ms"
            )
            whole.runbus = run
            results.rss_mib = stack.rss()
            messages = await whole_run.bus_messages(stack, clients, BUS_COUNT_RUNS)
            # The ratio to the hops' floor divides this shape's latency: its own counts.
            whole.messages = messages
            whole.hops_per_run = messages.by_kind["request/reply hops"]
            whole.events_per_run = messages.by_kind["run events"]
            print(
                f"  per run on the bus ({messages.runs} runs counted apart): "
                + ", ".join(f"{v:g} {k}" for k, v in messages.by_kind.items() if v)
                + "\n  hops by subject: "
                + ", ".join(f"{k} {v:g}" for k, v in messages.hops_by_subject.items())
                + "\n  KV writes and other by subject: "
                + ", ".join(f"{k} {v:g}" for k, v in messages.kv_and_other_by_subject.items())
                + f"\n  stored writes per run: {sum(messages.stored_by_stream.values()):g} ("
                + ", ".join(f"{k} {v:g}" for k, v in messages.stored_by_stream.items())
                + ")"
            )
            print(
                "  RSS after the runs (MiB): "
                + ", ".join(f"{k} {v:.0f}" for k, v in results.rss_mib.items())
            )
            for gateways in (1, 2):
                if gateways > len(stack.gateways):
                    await stack.add_gateway()
                print(f"  {gateways} gateway(s):")
                results.throughput[str(gateways)] = await whole_run.matrix(
                    clients,
                    args.levels,
                    args.run_n // args.trials,
                    args.trials,
                    cpu_seconds=lambda: sum(stack.cpu().values()) + time.process_time(),
                )
            if not args.quick:
                await stack.stop_gateway(stack.gateways[-1])
                try:
                    resumed = await resume.processes(stack)
                except Exception as exc:  # reported, the rest of the section still runs
                    print(f"  resume skipped: {type(exc).__name__}: {exc}")
                else:
                    print(
                        f"  resume: gateway killed mid-run → run.completed in "
                        f"{resumed.kill_to_completed_s:.1f} s (ack_wait {resumed.ack_wait_s:g} s;"
                        f" new gateway ready after {resumed.new_gateway_ready_s:.1f} s)"
                    )
                    results.resume = resumed
            args.results_dir.mkdir(parents=True, exist_ok=True)
            profiled = await profile.gateway(
                stack, clients, args.run_n, args.results_dir / "gateway_profile.txt"
            )
            print(f"  gateway profile ({profiled.runs} runs): {profiled.profile}")
            results.profile = profiled
        finally:
            await clients.close()


class Tee(io.TextIOBase):
    """Prints as usual and keeps a copy, so a section's printed table lands in the report."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


async def section(name: str, quick: bool) -> tuple[str, SectionNumbers]:
    """Run bench/<name>.py's `run_benchmark`, smaller in a quick run; its text and numbers."""
    module = importlib.import_module(f"bench.{name}")
    kwargs = QUICK_KWARGS.get(name, {}) if quick else {}
    if quick and hasattr(module, "SIZES"):
        # 100k memories, 10k-message histories: full run only.
        vars(module)["SIZES"] = module.SIZES[:-1]
    for constant, value in QUICK_CONSTANTS.get(name, {}).items() if quick else ():
        setattr(module, constant, value)
    # What earlier sections left on the heap would make every gc.collect() of a timed loop
    # (bench/compaction.py collects before each sample) slower than in the section alone.
    gc.collect()
    gc.freeze()
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        numbers = await module.run_benchmark(**kwargs)
    # A section that measures only what it prints returns None.
    assert numbers is None or isinstance(numbers, SectionNumbers), type(numbers)
    return tee.copy.getvalue(), numbers or SectionNumbers()


TARGET_SECTIONS = (
    "hop",
    "anchors",
    "processes",
    "slow_model",
    "overhead",
    "session_length",
    "long_session",
    "mcp_tool",
    "tools",
)
"""What `--targets` runs: every number a target is judged from (report.targets), and the
breakdown of the overhead at 300 ms."""
PARTIAL_RESULTS = Path(tempfile.gettempdir()) / "runbus-bench"
"""Where a run of some sections writes its report unless told otherwise."""
BUS_COUNT_RUNS = 20
"""Sequential runs over which the processes section counts the messages of a run."""
RESUME_ACK_WAIT = 1.5
"""The in-process gateway's lowered ack_wait: the processes keep the default."""
SECTIONS = (
    "history",
    "compaction",
    "model_router",
    "tools",
    "memory",
    "memory_eval",
    "real_model",
    "long_session",
    "held_deltas",
    "mcp_tool",
    "child_run",
)
"""Per-service benchmarks, each a module of this folder with `run_benchmark()`."""
QUICK_CONSTANTS: dict[str, dict[str, int]] = {"tools": {"N_OVERHEAD": 500}}
QUICK_KWARGS: dict[str, dict[str, int]] = {
    "history": {"repeat": 50},
    "model_router": {"n": 500},
    "memory": {"repeat": 100, "writes": 300},
    "memory_eval": {"real_model": 0},
    "long_session": {"turns": 200},
    "held_deltas": {"runs": 5},
    "mcp_tool": {"runs": 20},
    "child_run": {"runs": 20},
}


def machine() -> Machine:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return Machine(
        cpus=os.cpu_count(),
        cpu_model=model,
        platform=platform.platform(),
        python=platform.python_version(),
        memory_gb=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    )


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning")
    results = Results(
        meta=Meta(
            timestamp=datetime.now(UTC).isoformat(timespec="seconds"),
            commit=git("rev-parse", "--short", "HEAD"),
            dirty=bool(git("status", "--porcelain", "--untracked-files=no")),
            machine=machine(),
            quick=args.quick,
            loop="uvloop",
        )
    )
    began = time.perf_counter()
    starts: list[tuple[str, float]] = []

    def wanted(name: str) -> bool:
        """Whether to run section `name`; if so, its start time is noted and what the
        sections before it measured is written (a run stopped part-way keeps its numbers)."""
        if args.only not in (None, name) or (args.sections and name not in args.sections):
            return False
        if starts and args.only is None:
            results.meta.completed_sections = [n for n, _ in starts]
            report.write(results, args.results_dir)
        starts.append((name, time.perf_counter()))
        return True

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        print(f"runbus bench — nats-server {server.url}, uvloop, tracing on (no exporter)")
        if wanted("hop"):
            results.floor, results.hop = await bench_hop(server.url, args.hop_n)
        if wanted("run"):
            in_process = await bench_run(server.url, args.run_n, 64, Path(tmp) / "data")
            results.whole_run = WholeRun(
                in_process=in_process,
                hops_per_run=in_process.hops_per_run,
                events_per_run=in_process.events_per_run,
            )
        if wanted("resume"):
            print(f"\n[resume] gateway lost mid-run, in process, ack_wait {RESUME_ACK_WAIT:g} s")
            lowered = await resume.in_process(RESUME_ACK_WAIT, 1 if args.quick else 5)
            print(
                f"  kill → run.completed: median {lowered.kill_to_completed_s:.2f} s "
                f"(ack_wait {RESUME_ACK_WAIT:g} s + a {lowered.tool_s:g} s tool run again)"
            )
            results.resume_in_process = lowered
    if wanted("maf"):
        results.maf = await bench_maf(args.run_n, args.levels, args.trials)
    if wanted("anchors"):
        results.anchors = await anchors.measure(args.run_n, args.levels, args.trials)
    if wanted("processes"):
        await bench_processes(args, results)
    if wanted("slow_model"):
        with tempfile.TemporaryDirectory() as tmp:
            levels = (1, 64) if args.quick else slow_model.LEVELS
            rounds = 1 if args.quick else slow_model.ROUNDS
            results.slow_model = await slow_model.measure(levels, Path(tmp), rounds)
    if wanted("overhead"):
        results.overhead = await overhead.measure(5 if args.quick else 20)
    if wanted("session_length"):
        runs, rounds = (30, 1) if args.quick else (100, 3)
        results.session_length = await session_length.measure(runs, rounds)
    for name in SECTIONS:
        if wanted(name):
            text, numbers = await section(name, args.quick)
            results.sections[name] = text
            results.add(numbers)
    ends = [t for _, t in starts[1:]] + [time.perf_counter()]
    results.meta.section_s = {
        name: round(end - start, 1) for (name, start), end in zip(starts, ends, strict=True)
    }
    results.meta.duration_s = round(time.perf_counter() - began, 1)
    results.meta.completed_sections = [name for name, _ in starts]
    written = report.write(results, args.results_dir)
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    for target in report.targets(results):
        print(f"  {target.name}: {target.show(target.measured)} ({target.verdict})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--only",
        choices=[
            "hop",
            "run",
            "resume",
            "maf",
            "anchors",
            "processes",
            "slow_model",
            "overhead",
            "session_length",
            *SECTIONS,
        ],
    )
    parser.add_argument("--quick", action="store_true", help="a 1-2 minute smoke run")
    parser.add_argument(
        "--sections", type=lambda v: set(v.split(",")), help="only these, comma-separated"
    )
    parser.add_argument(
        "--targets",
        action="store_true",
        help="only the sections the targets are judged from: " + ", ".join(TARGET_SECTIONS),
    )
    parser.add_argument("--hop-n", type=int)
    parser.add_argument("--run-n", type=int)
    parser.add_argument(
        "--results-dir",
        type=Path,
        help=f"where the report goes; default {report.RESULTS} for a run of every section, "
        f"{PARTIAL_RESULTS} for a run of some (so it never replaces the full report)",
    )
    args = parser.parse_args()
    if args.targets:
        args.sections = (args.sections or set()) | set(TARGET_SECTIONS)
    partial = args.only is not None or args.sections is not None
    args.results_dir = args.results_dir or (PARTIAL_RESULTS if partial else report.RESULTS)
    args.hop_n = args.hop_n or (1000 if args.quick else 3000)
    args.run_n = args.run_n or (60 if args.quick else 300)
    args.levels = (1, 8, 64)
    args.trials = 1 if args.quick else 3  # rounds per throughput point; runs/s is their median
    uvloop.run(main(args))
