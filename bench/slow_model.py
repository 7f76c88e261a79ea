"""A 300 ms model: the same 3-tool run against a loopback OpenAI-compatible server
(bench/loopback_model.py, its own process), called by runbus's model_router (msgspec over
HTTP) and by LangGraph's model node (the openai SDK) at 1 / 64 / 256 / 1000 runs in flight:
runs/s, latency, failures, CPU per run and peak RSS of every process. runbus runs as six
processes with one gateway allowed 1000 runs at once; LangGraph runs in its own process with
its in-memory and Postgres savers (bench/graph_anchor.py, a fresh process per round).

The systems take turns round by round (runbus, LangGraph in-memory, LangGraph + Postgres, then
again), so the machine's noise falls on all of them alike; at 1 and at the top level (the levels
the targets read) there are ROUNDS rounds and a point is their median, in between one round.
Every round also reads the model server's own account of itself (its CPU per call, how late it
answered, its event loop's lag), so a level bound by the model server shows as such."""

import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from bench import postgres
from bench.anchors import graph_anchor
from bench.loopback_model import ModelServer, server_process
from bench.processes import process_stack
from bench.results import SlowModel
from bench.timing import in_flight_round, pct, points_per_level
from bench.whole_run import Clients

LATENCY = 0.3
LEVELS = (1, 64, 256, 1000)
ROUNDS = 3
"""Rounds at 1 and at the top level; a point there is the median round."""
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
def loopback_server(latency: float = LATENCY) -> Iterator[ModelServer]:
    """The loopback model server (bench/loopback_model.py) as a child process."""
    with server_process("bench.loopback_model", "--latency", str(latency)) as server:
        yield server


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


Round = Callable[[int], Awaitable[dict[str, Any]]]
"""One round of a system at a level of runs in flight: its point."""


def runbus_round(stack: Any, clients: Clients) -> Round:
    async def one_round(level: int) -> dict[str, Any]:
        total = points_per_level(level)
        stack.reset_peaks()
        before, client_cpu = stack.cpu(), time.process_time()
        samples, failures, elapsed = await in_flight_round(
            lambda: clients.one("slow"), level, total, failure_kind
        )
        after, client_cpu = stack.cpu(), time.process_time() - client_cpu
        by_process = {k: (after[k] - before.get(k, 0.0)) * 1000 / total for k in after}
        by_process["client"] = client_cpu * 1000 / total
        ms = [s * 1000 for s in samples] or [float("nan")]
        return {
            "runs": total,
            "runs_per_s": len(samples) / elapsed,
            "failures": len(failures),
            "failure_kinds": sorted(set(failures))[:5],
            "p50_ms": statistics.median(ms),
            "p99_ms": pct(ms, 0.99),
            "cpu_ms_per_run": sum(by_process.values()),
            "cpu_ms_by_process": by_process,
            "cores_by_process": {k: v * total / 1000 / elapsed for k, v in by_process.items()},
            "peak_rss_mib": stack.rss("VmHWM"),
        }

    return one_round


def anchor_round(saver: str, url: str, db: postgres.Postgres | None = None) -> Round:
    async def one_round(level: int) -> dict[str, Any]:
        args = ["--model-url", url, "--levels", str(level)]
        points: dict[str, Any] = await graph_anchor(saver, args, db)
        point = dict(points[str(level)])
        # Its own process and the database's backends, together: the anchor reports one sum.
        name = "LangGraph process" + (" + database" if db is not None else "")
        point["cores_by_process"] = {name: point["cpu_ms_per_run"] * point["runs_per_s"] / 1000}
        return point

    return one_round


def model_server_round(seen: dict[str, Any]) -> dict[str, Any]:
    """The model server's share of a round (its stats since the round began): cores busy,
    CPU per call (its lag watcher included, which shows at low call rates), how late it
    answered, how slowly its callers sent their bodies, its event loop's lag."""
    calls = seen["calls"]
    return {
        "calls": calls,
        "cores": seen["cpu_s"] / seen["wall_s"] if seen["wall_s"] > 0 else 0.0,
        "cpu_ms_per_call": seen["cpu_s"] * 1000 / max(calls, 1),
        "late_p99_ms": seen["late_ms"]["p99"],
        "body_p99_ms": seen["body_ms"]["p99"],
        "lag_p99_ms": seen["lag_ms"]["p99"],
        "lag_max_ms": seen["lag_ms"]["max"],
    }


def median_point(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from a level's rounds: the median round's numbers (by runs/s), failures
    summed over every round, each process's highest peak RSS."""
    ordered = sorted(rounds, key=lambda r: r["runs_per_s"])
    point = dict(ordered[(len(ordered) - 1) // 2])
    point["rounds_runs_per_s"] = [r["runs_per_s"] for r in rounds]
    point["runs"] = sum(r["runs"] for r in rounds)
    point["failures"] = sum(r["failures"] for r in rounds)
    point["failure_kinds"] = sorted({k for r in rounds for k in r["failure_kinds"]})[:5]
    for key in ("p50_ms", "p99_ms", "cpu_ms_per_run"):
        point[key] = statistics.median(r[key] for r in rounds)
    peaks: dict[str, float] = {}
    for r in rounds:
        for name, mib in r["peak_rss_mib"].items():
            peaks[name] = max(peaks.get(name, 0.0), mib)
    point["peak_rss_mib"] = peaks
    return point


def _print_point(name: str, level: int, point: dict[str, Any]) -> None:
    peak = point["peak_rss_mib"]
    model = point.get("model_server") or {}
    rounds = point.get("rounds_runs_per_s") or [point["runs_per_s"]]
    print(
        f"  {name:<28} {level:>4} in flight: {point['runs_per_s']:6.1f} runs/s "
        f"(rounds {' '.join(f'{r:.1f}' for r in rounds)})  "
        f"p50 {point['p50_ms']:7.0f} ms  p99 {point['p99_ms']:7.0f} ms  "
        f"failures {point['failures']}  CPU {point['cpu_ms_per_run']:.1f} ms/run  "
        f"peak RSS {sum(peak.values()):.0f} MiB;  model server {model.get('cores', 0):.2f} "
        f"cores, {model.get('cpu_ms_per_call', 0):.2f} ms CPU/call, "
        f"late p99 {model.get('late_p99_ms', 0):.1f} ms, "
        f"lag p99 {model.get('lag_p99_ms', 0):.1f} ms"
    )
    cores = point.get("cores_by_process")
    if cores:
        print("    cores busy: " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items() if v >= 0.01))


@contextlib.contextmanager
def maybe_postgres(results: dict[str, Any]) -> Iterator[postgres.Postgres | None]:
    """A Postgres server, or None (and the reason in `results`) where none can start."""
    try:
        with postgres.server() as db:
            yield db
    except postgres.Unavailable as exc:
        print(f"  LangGraph + Postgres skipped: {exc}")
        results["langgraph_postgres_skipped"] = str(exc)
        yield None


async def measure(levels: tuple[int, ...], tmp: Path, rounds: int = ROUNDS) -> SlowModel:
    print(
        f"\n[slow model] {LATENCY * 1000:.0f} ms loopback OpenAI server, openai SDK both sides; "
        f"systems take turns, {rounds} round(s) at 1 and {max(levels)} in flight"
    )
    results: dict[str, Any] = {"latency_ms": LATENCY * 1000, "levels": list(levels)}
    results["rounds"] = rounds
    with loopback_server() as model, maybe_postgres(results) as db:
        async with runbus_stack(model.url, tmp) as (stack, clients):
            await clients.one("slow")
            systems: dict[str, tuple[str, Round]] = {
                "runbus": ("runbus, six processes", runbus_round(stack, clients)),
                "langgraph_memory": ("LangGraph, memory saver", anchor_round("memory", model.url)),
            }
            if db is not None:
                systems["langgraph_postgres"] = (
                    "LangGraph, postgres saver",
                    anchor_round("postgres", model.url, db),
                )
            for level in levels:
                repeat = rounds if level in (1, max(levels)) else 1
                by_system: dict[str, list[dict[str, Any]]] = {key: [] for key in systems}
                for _ in range(repeat):
                    for key, (_, one_round) in systems.items():
                        model.stats()  # starts the server's count afresh
                        point = await one_round(level)
                        point["model_server"] = model_server_round(model.stats())
                        by_system[key].append(point)
                for key, (name, _) in systems.items():
                    point = median_point(by_system[key])
                    results.setdefault(key, {})[str(level)] = point
                    _print_point(name, level, point)
    return msgspec.convert(results, SlowModel)
