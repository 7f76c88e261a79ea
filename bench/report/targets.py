"""The targets runbus holds itself to, each judged from numbers of one bench run."""

from dataclasses import dataclass

from bench.report.cells import count, ms, ratio, times
from bench.results import Results, SlowPoint

HOP_LIMIT = 1.25
"""A runbus hop (codec, headers, tracing, micro) at most this many times the raw round trip."""
RUN_LIMIT = 1.5
"""A whole run at most this many times (request/reply hops x the raw round trip)."""
SCALING_AT_4 = 3.5
"""Calls/s with 4 tool_executor replicas at least this many times that of one."""
CPU_VS_POSTGRES = 0.5
"""CPU per run at most this share of LangGraph + Postgres's for the same run."""
RATE_VS_POSTGRES = 3.0
"""Runs/s (64 clients; 300 ms model at 1000 in flight) at least this many times LangGraph +
Postgres's."""
SESSION_GROWTH = 1.2
"""Run 100 of a session at most this many times run 1 (persisted compaction)."""
LONG_SESSION_GROWTH = 1.5
"""A run at turn 1,000 of a session without compaction in its agent file at most this many
times one at turn 10."""
MCP_VS_NATIVE = 2.0
"""A run calling an MCP stdio tool at most this many times the same run calling a native one."""
MEMORY_IDLE_MIB = 120.0
STACK_IDLE_MIB = 450.0
MODEL_CALLS = 4
"""Model calls of the bench run: the overhead at the 300 ms model is p50 - 4 x 300 ms."""
SERVICES = ("gateway#1", "history", "memory", "compaction", "model_router", "tool_executor")


@dataclass(frozen=True)
class Target:
    name: str
    measured: float | None
    """The ratio (or, with a `unit`, the amount) measured."""
    limit: float
    at_least: bool
    """True when the ratio must reach `limit` (scaling), False when it must stay under it."""
    basis: str
    """How the ratio was formed, in words, with its absolute numbers."""
    unit: str = "x"
    """`x` for a ratio, else the unit of an absolute limit (` MiB`)."""
    also: bool = True
    """A condition that must hold besides the ratio (no failed runs)."""

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        within = self.measured >= self.limit if self.at_least else self.measured <= self.limit
        return within and self.also

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]

    def show(self, value: float | None) -> str:
        if self.unit == "x":
            return times(value)
        return "-" if value is None else f"{value:.0f}{self.unit}"


def targets(results: Results) -> list[Target]:
    """Every target runbus holds itself to (per-hop overhead, whole run, tool scaling, and
    against the durable peer, long sessions and memory), each from numbers of this one run."""
    floor = results.floor.request_reply.p50_ms if results.floor else None
    hop = results.hop.runbus.p50_ms if results.hop else None
    whole = results.whole_run
    run = whole.runbus.p50_ms if whole and whole.runbus else None
    hops = whole.hops_per_run if whole else None
    run_floor = hops * floor if hops is not None and floor is not None else None
    points = {p.replicas: p.calls_per_s for p in results.tool_scaling}
    return [
        Target(
            "per-hop overhead (p50)",
            ratio(hop, floor),
            HOP_LIMIT,
            at_least=False,
            basis=f"runbus hop {ms(hop)} ms / raw request/reply {ms(floor)} ms",
        ),
        Target(
            "whole run vs hops x floor (p50)",
            ratio(run, run_floor),
            RUN_LIMIT,
            at_least=False,
            basis=f"run {ms(run)} ms / ({count(hops)} hops x {ms(floor)} ms = {ms(run_floor)} ms)",
        ),
        Target(
            "tool scaling at 4 replicas",
            ratio(points.get(4), points.get(1)),
            SCALING_AT_4,
            at_least=True,
            basis=f"{points.get(4, 0):.0f} calls/s / {points.get(1, 0):.0f} calls/s at 1",
        ),
        *durable_targets(results),
        long_session_target(results),
        mcp_target(results),
    ]


def mcp_target(results: Results) -> Target:
    """One tool call per run, to mcp-server-time over stdio against a native registry tool."""
    mcp = results.mcp_tool
    return Target(
        "MCP stdio tool call vs native, whole run (p50)",
        mcp.ratio if mcp else None,
        MCP_VS_NATIVE,
        at_least=False,
        basis=f"run with an MCP call {ms(mcp.mcp_p50_ms if mcp else None)} ms / with a native "
        f"call {ms(mcp.native_p50_ms if mcp else None)} ms ({mcp.runs if mcp else 0} runs each, "
        f"interleaved); the bare call on the bus {ms(mcp.call_mcp_p50_ms if mcp else None)} ms "
        f"/ {ms(mcp.call_native_p50_ms if mcp else None)} ms",
    )


def long_session_target(results: Results) -> Target:
    """A session far past the bus's max payload, no compaction in its agent file: its late
    runs against turn 10 (and every run completed)."""
    long = results.long_session
    return Target(
        f"turn {long.turns if long else 1000} vs turn 10 of a session, no compaction",
        long.late_over_early if long else None,
        LONG_SESSION_GROWTH,
        at_least=False,
        basis=f"median of the last 50 turns {ms(long.late_ms if long else None)} ms / "
        f"turn 10 {ms(long.early_ms if long else None)} ms ({long.turn_bytes if long else 0}"
        f" B turns, max payload {long.max_payload if long else 0:,} B; every run completed)",
    )


def best_rate(results: Results, clients: str) -> tuple[float | None, str]:
    """runbus's runs/s at `clients` clients, the better of its gateway counts, and which."""
    best: tuple[float | None, str] = (None, "-")
    for gateways, points in results.throughput.items():
        point = points.get(clients)
        if point is not None and (best[0] is None or point.runs_per_s > best[0]):
            best = (point.runs_per_s, gateways)
    return best


def durable_targets(results: Results) -> list[Target]:
    """The targets against the durable peer, the 300 ms model, long sessions and memory."""
    postgres = results.anchors.langgraph_postgres if results.anchors else None
    whole = results.whole_run
    runbus_cpu = whole.runbus.cpu_ms_per_run.total if whole and whole.runbus else None
    pg_cpu = postgres.cpu_ms_per_run if postgres else None
    one_gateway64 = results.throughput.get("1", {}).get("64")
    runbus_cpu64 = one_gateway64.cpu_ms_per_run if one_gateway64 else None
    pg_cpu64 = postgres.cpu_ms_per_run_by_clients.get("64") if postgres else None
    rate64, gateways = best_rate(results, "64")
    pg64 = postgres.runs_per_s.get("64") if postgres else None
    slow = results.slow_model
    top = str(max(slow.levels or [0])) if slow else "0"
    rb_slow = slow.runbus.get(top) if slow else None
    pg_slow = slow.langgraph_postgres.get(top) if slow else None
    failures = (rb_slow.failures if rb_slow else 0) + (pg_slow.failures if pg_slow else 0)
    floor_ms = MODEL_CALLS * (slow.latency_ms if slow else 300.0)
    rb_one = _p50(slow.runbus.get("1") if slow else None)
    lg_one = _p50(slow.langgraph_memory.get("1") if slow else None)
    rb_over = rb_one - floor_ms if rb_one is not None else None
    lg_over = lg_one - floor_ms if lg_one is not None else None
    session = results.session_length
    persisted = session.persisted if session else None
    windowed = session.windowed if session else None
    runs = session.runs if session else None
    rss = results.rss_mib
    stack = sum(rss[k] for k in SERVICES if k in rss) if rss else None
    return [
        Target(
            "CPU per run vs LangGraph + Postgres, runs one at a time",
            ratio(runbus_cpu, pg_cpu),
            CPU_VS_POSTGRES,
            at_least=False,
            basis=f"runbus {ms(runbus_cpu)} ms (every process) / LangGraph + Postgres "
            f"{ms(pg_cpu)} ms (its process + the database server)",
        ),
        Target(
            "CPU per run vs LangGraph + Postgres, 64 clients",
            ratio(runbus_cpu64, pg_cpu64),
            CPU_VS_POSTGRES,
            at_least=False,
            basis=f"runbus {ms(runbus_cpu64)} ms (1 gateway, every process) / LangGraph + "
            f"Postgres {ms(pg_cpu64)} ms, over the rounds of the runs/s at 64 clients",
        ),
        Target(
            "runs/s at 64 clients vs LangGraph + Postgres",
            ratio(rate64, pg64),
            RATE_VS_POSTGRES,
            at_least=True,
            basis=f"runbus {rate64 or 0:.1f} runs/s ({gateways} gateway(s)) / LangGraph + "
            f"Postgres {pg64 or 0:.1f} runs/s",
        ),
        Target(
            f"300 ms model, {top} in flight vs LangGraph + Postgres, 0 failures",
            ratio(_rate(rb_slow), _rate(pg_slow)),
            RATE_VS_POSTGRES,
            at_least=True,
            basis=f"runbus {_rate(rb_slow) or 0:.1f} runs/s / LangGraph + Postgres "
            f"{_rate(pg_slow) or 0:.1f} runs/s; failures {_failures(rb_slow)}"
            f" / {_failures(pg_slow)}",
            also=failures == 0,
        ),
        Target(
            "300 ms model, overhead of one run vs LangGraph in-memory",
            ratio(rb_over, lg_over),
            1.0,
            at_least=False,
            basis=f"runbus {ms(rb_over)} ms / LangGraph in-memory {ms(lg_over)} ms beyond "
            f"{MODEL_CALLS} x {floor_ms / MODEL_CALLS:.0f} ms (p50 at 1 in flight)",
        ),
        Target(
            f"run {runs or 100} vs run 1 of a session, persisted compaction",
            persisted.last_over_first if persisted else None,
            SESSION_GROWTH,
            at_least=False,
            basis=f"median of the last 5 runs {ms(persisted.last_ms if persisted else None)} ms "
            f"/ first 5 {ms(persisted.first_ms if persisted else None)} ms (same policy without "
            f"persist: {times(windowed.last_over_first if windowed else None)})",
        ),
        Target(
            "memory service RSS, no agent using memory",
            rss.get("memory"),
            MEMORY_IDLE_MIB,
            at_least=False,
            basis="VmRSS after the sequential runs (the bench agent has memory off)",
            unit=" MiB",
        ),
        Target(
            "six-service stack RSS, idle",
            stack,
            STACK_IDLE_MIB,
            at_least=False,
            basis="sum of VmRSS of the six service processes after the sequential runs "
            f"(nats-server {rss.get('nats-server', 0):.0f} MiB not counted)",
            unit=" MiB",
        ),
    ]


def _p50(point: SlowPoint | None) -> float | None:
    return point.p50_ms if point else None


def _rate(point: SlowPoint | None) -> float | None:
    return point.runs_per_s if point else None


def _failures(point: SlowPoint | None) -> str:
    return "-" if point is None else str(point.failures)
