"""A 300 ms model: the same 3-tool run against a loopback OpenAI-compatible server
(bench/loopback_model.py, its own process) with the openai SDK on both sides — runbus's
model_router and LangGraph's model node — at 1 / 64 / 256 / 1000 runs in flight: runs/s,
latency, failures, CPU per run and peak RSS of every process. runbus runs as six processes with
one gateway allowed 1000 runs at once; LangGraph runs in its own process with its in-memory and
Postgres savers (bench/graph_anchor.py)."""

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench import postgres
from bench.anchors import graph_anchor
from bench.processes import REPO, process_stack
from bench.timing import in_flight_round, pct, points_per_level
from bench.whole_run import Clients

LATENCY = 0.3
LEVELS = (1, 64, 256, 1000)
SLOW_AGENT = """
name = "slow"
instructions = "You are a travel assistant."
model = "slow"
tools = ["get_weather", "search_flights", "create_booking"]
[memory]
enabled = false
"""
ROUTES = """
[backends.loopback]
base_url = "{url}"
[[routes.slow.targets]]
backend = "loopback"
model = "bench-300ms"
timeout = 300
retries = 0
"""


@contextlib.contextmanager
def loopback_server(latency: float = LATENCY) -> Iterator[str]:
    """The loopback model server as a child process; its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.loopback_model", "--latency", str(latency)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"loopback model server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        process.terminate()
        process.wait(10)


@contextlib.asynccontextmanager
async def runbus_stack(url: str, tmp: Path) -> AsyncIterator[tuple[Any, Clients]]:
    routes = tmp / "routes.toml"
    routes.write_text(ROUTES.format(url=url))
    env = {"RUNBUS_MODEL_ROUTES": str(routes), "RUNBUS_RUN_CONCURRENCY": "1000"}
    async with process_stack(agents={"slow": SLOW_AGENT}, env=env) as stack:
        clients = await Clients.open(stack.url, count=8)
        try:
            yield stack, clients
        finally:
            await clients.close()


def failure_kind(exc: Exception) -> str:
    code = getattr(exc, "remote_code", None) or type(exc).__name__
    return f"{code}: {str(exc)[:120]}"


async def runbus_levels(url: str, levels: tuple[int, ...], tmp: Path) -> dict[str, Any]:
    points: dict[str, Any] = {}
    async with runbus_stack(url, tmp) as (stack, clients):
        await clients.one("slow")
        for level in levels:
            total = points_per_level(level)
            stack.reset_peaks()
            before, client_cpu = stack.cpu(), time.process_time()
            samples, failures, elapsed = await in_flight_round(
                lambda: clients.one("slow"), level, total, failure_kind
            )
            after, client_cpu = stack.cpu(), time.process_time() - client_cpu
            cpu = sum(after[k] - before.get(k, 0.0) for k in after) + client_cpu
            ms = [s * 1000 for s in samples] or [float("nan")]
            points[str(level)] = {
                "runs": total,
                "runs_per_s": len(samples) / elapsed,
                "failures": len(failures),
                "failure_kinds": sorted(set(failures))[:5],
                "p50_ms": statistics.median(ms),
                "p99_ms": pct(ms, 0.99),
                "cpu_ms_per_run": cpu * 1000 / total,
                "peak_rss_mib": stack.rss("VmHWM"),
            }
            _print_point("runbus, six processes", level, points[str(level)])
    return points


async def anchor_levels(
    saver: str, url: str, levels: tuple[int, ...], db: postgres.Postgres | None = None
) -> dict[str, Any]:
    args = ["--model-url", url, "--levels", ",".join(map(str, levels))]
    points: dict[str, Any] = await graph_anchor(saver, args, db)
    for level, point in points.items():
        _print_point(f"LangGraph, {saver} saver", int(level), point)
    return points


def _print_point(name: str, level: int, point: dict[str, Any]) -> None:
    peak = point["peak_rss_mib"]
    print(
        f"  {name:<28} {level:>4} in flight: {point['runs_per_s']:6.1f} runs/s  "
        f"p50 {point['p50_ms']:7.0f} ms  p99 {point['p99_ms']:7.0f} ms  "
        f"failures {point['failures']}  CPU {point['cpu_ms_per_run']:.1f} ms/run  "
        f"peak RSS {sum(peak.values()):.0f} MiB"
    )


async def measure(levels: tuple[int, ...], tmp: Path) -> dict[str, Any]:
    print(f"\n[slow model] {LATENCY * 1000:.0f} ms loopback OpenAI server, openai SDK both sides")
    results: dict[str, Any] = {"latency_ms": LATENCY * 1000, "levels": list(levels)}
    with loopback_server() as url:
        results["runbus"] = await runbus_levels(url, levels, tmp)
        results["langgraph_memory"] = await anchor_levels("memory", url, levels)
        try:
            with postgres.server() as db:
                results["langgraph_postgres"] = await anchor_levels("postgres", url, levels, db)
        except postgres.Unavailable as exc:
            print(f"  LangGraph + Postgres skipped: {exc}")
            results["langgraph_postgres_skipped"] = str(exc)
    return results
