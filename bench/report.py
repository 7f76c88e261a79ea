"""`make bench`'s output: results.json (every number, the machine, the commit), results.md
(tables with each ratio next to the absolute numbers it comes from, targets met or missed) and
the PNG plots, all under bench/results/."""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

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
MEMORY_IDLE_MIB = 120.0
STACK_IDLE_MIB = 450.0
MODEL_CALLS = 4
"""Model calls of the bench run: the overhead at the 300 ms model is p50 - 4 x 300 ms."""
SERVICES = ("gateway#1", "history", "memory", "compaction", "model_router", "tool_executor")


def ratio(value: float | None, base: float | None) -> float | None:
    """`value / base`, or None when either is missing or the base is not positive."""
    if value is None or base is None or base <= 0 or math.isnan(value):
        return None
    return value / base


def times(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def count(value: float | None) -> str:
    """A count per run (`18`, `10.5`), or `?` when it was not measured."""
    return "?" if value is None else f"{value:g}"


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


def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def targets(results: dict[str, Any]) -> list[Target]:
    """Every target runbus holds itself to (per-hop overhead, whole run, tool scaling, and
    against the durable peer, long sessions and memory), each from numbers of this one run."""
    floor = _get(results, "floor", "request_reply", "p50_ms")
    hop = _get(results, "hop", "runbus", "p50_ms")
    run = _get(results, "whole_run", "runbus", "p50_ms")
    hops = _get(results, "whole_run", "hops_per_run")
    run_floor = hops * floor if hops is not None and floor is not None else None
    points = {p["replicas"]: p["calls_per_s"] for p in _get(results, "tool_scaling") or []}
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
    ]


def _best_rate(results: dict[str, Any], clients: str) -> tuple[float | None, str]:
    """runbus's runs/s at `clients` clients, the better of its gateway counts, and which."""
    best: tuple[float | None, str] = (None, "-")
    for gateways, points in (_get(results, "throughput") or {}).items():
        rate = (points.get(clients) or {}).get("runs_per_s")
        if rate is not None and (best[0] is None or rate > best[0]):
            best = (rate, gateways)
    return best


def durable_targets(results: dict[str, Any]) -> list[Target]:
    """The targets against the durable peer, the 300 ms model, long sessions and memory."""
    postgres = _get(results, "anchors", "langgraph_postgres") or {}
    runbus_cpu = _get(results, "whole_run", "runbus", "cpu_ms_per_run", "total")
    pg_cpu = postgres.get("cpu_ms_per_run")
    runbus_cpu64 = _get(results, "throughput", "1", "64", "cpu_ms_per_run")
    pg_cpu64 = (postgres.get("cpu_ms_per_run_by_clients") or {}).get("64")
    rate64, gateways = _best_rate(results, "64")
    pg64 = (postgres.get("runs_per_s") or {}).get("64")
    slow = _get(results, "slow_model") or {}
    top = str(max(slow.get("levels") or [0]))
    rb_slow = (slow.get("runbus") or {}).get(top) or {}
    pg_slow = (slow.get("langgraph_postgres") or {}).get(top) or {}
    failures = rb_slow.get("failures", 0) + pg_slow.get("failures", 0)
    floor_ms = MODEL_CALLS * slow.get("latency_ms", 300.0)
    rb_one = ((slow.get("runbus") or {}).get("1") or {}).get("p50_ms")
    lg_one = ((slow.get("langgraph_memory") or {}).get("1") or {}).get("p50_ms")
    rb_over = rb_one - floor_ms if rb_one is not None else None
    lg_over = lg_one - floor_ms if lg_one is not None else None
    persisted = _get(results, "session_length", "persisted") or {}
    windowed = _get(results, "session_length", "windowed") or {}
    runs = _get(results, "session_length", "runs")
    rss = _get(results, "rss_mib") or {}
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
            ratio(rb_slow.get("runs_per_s"), pg_slow.get("runs_per_s")),
            RATE_VS_POSTGRES,
            at_least=True,
            basis=f"runbus {rb_slow.get('runs_per_s', 0):.1f} runs/s / LangGraph + Postgres "
            f"{pg_slow.get('runs_per_s', 0):.1f} runs/s; failures {rb_slow.get('failures', '-')}"
            f" / {pg_slow.get('failures', '-')}",
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
            persisted.get("last_over_first"),
            SESSION_GROWTH,
            at_least=False,
            basis=f"median of the last 5 runs {ms(persisted.get('last_ms'))} ms / first 5 "
            f"{ms(persisted.get('first_ms'))} ms (same policy without persist: "
            f"{times(windowed.get('last_over_first'))})",
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


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _latency_row(name: str, point: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    point = point or {}
    base = base or {}
    return [
        name,
        ms(point.get("p50_ms")),
        times(ratio(point.get("p50_ms"), base.get("p50_ms"))),
        ms(point.get("p99_ms")),
        times(ratio(point.get("p99_ms"), base.get("p99_ms"))),
    ]


def whole_run_rows(results: dict[str, Any]) -> list[list[str]]:
    """runbus over the bus next to MAF in process and the physical floor of its hops."""
    maf = _get(results, "maf") or {}
    runbus = _get(results, "whole_run", "runbus") or {}
    in_process = _get(results, "whole_run", "in_process") or {}
    floor = _get(results, "floor", "request_reply", "p50_ms")
    hops = _get(results, "whole_run", "hops_per_run")
    run_floor = hops * floor if hops is not None and floor is not None else None
    cpu = runbus.get("cpu_ms_per_run", {})
    rows = []
    for name, point, cpu_ms in (
        ("MAF in process (anchor)", maf, maf.get("cpu_ms_per_run")),
        ("runbus, six processes", runbus, cpu.get("total")),
        ("runbus, services in one process", in_process, None),
    ):
        if not point:
            continue
        rows.append(
            [
                name,
                ms(point.get("p50_ms")),
                ms(point.get("p99_ms")),
                times(ratio(point.get("p50_ms"), maf.get("p50_ms"))),
                times(ratio(point.get("p50_ms"), run_floor)),
                "-" if cpu_ms is None else f"{cpu_ms:.2f}",
                times(ratio(cpu_ms, maf.get("cpu_ms_per_run"))),
            ]
        )
    return rows


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    machine = meta.get("machine", {})
    out = [
        "# runbus benchmark results",
        "",
        f"{meta.get('timestamp', '?')}, commit `{meta.get('commit', '?')}`"
        f"{' (uncommitted changes)' if meta.get('dirty') else ''}, "
        f"{machine.get('cpus', '?')} CPUs ({machine.get('cpu_model', '?')}), "
        f"Python {machine.get('python', '?')}, {'quick' if meta.get('quick') else 'full'} run. "
        "Every comparison below was measured in this one process run on this machine; p50 is "
        "the median of the repeated trials. Ratios sit next to the numbers they divide.",
        "",
        "Sections measured: " + ", ".join(meta.get("completed_sections") or ["?"]) + ".",
        "",
        "## Targets",
        "",
    ]
    out += _table(
        ["target", "measured", "limit", "verdict", "from"],
        [
            [
                t.name,
                t.show(t.measured),
                ("≥ " if t.at_least else "≤ ") + f"{t.limit:g}{t.unit}",
                t.verdict,
                t.basis,
            ]
            for t in targets(results)
        ],
    )
    out += durable_sections(results)
    floor = _get(results, "floor") or {}
    rr = floor.get("request_reply")
    out += ["## 1-2. Physical floor and one runbus hop (ms)", ""]
    out += _table(
        ["path", "p50", "p50 / raw", "p99", "p99 / raw"],
        [
            _latency_row("raw nats-py request/reply (floor)", rr, rr),
            _latency_row("raw JetStream publish (ack)", floor.get("js_publish"), rr),
            _latency_row("runbus Bus.request + Service", _get(results, "hop", "runbus"), rr),
        ],
    )
    hops = _get(results, "whole_run", "hops_per_run")
    events = _get(results, "whole_run", "events_per_run")
    events = round(events, 1) if events is not None else None
    js = _get(results, "floor", "js_publish", "p50_ms")
    rr_p50 = rr.get("p50_ms") if rr else None
    fuller = hops * rr_p50 + events * js if None not in (hops, events, js, rr_p50) else None
    run_p50 = _get(results, "whole_run", "runbus", "p50_ms")
    out += [
        "## 3. Whole run: 3-tool travel run, zero-latency scripted model (ms)",
        "",
        f"Per run: {count(hops)} request/reply hops and {count(events)} run events published "
        "to JetStream (the run request is one more). Floor of the hops alone: "
        f"{count(hops)} x {ms(rr_p50)} ms; with the event publishes at the JetStream floor, "
        f"{ms(fuller)} ms, which the six-process run takes {times(ratio(run_p50, fuller))} of. "
        "CPU per run is the sum over every process (services, nats-server, client) for runbus, "
        "the one process for MAF.",
        "",
    ]
    out += messages_section(results)
    out += _table(
        ["", "p50", "p99", "p50 / MAF", "p50 / (hops x floor)", "CPU ms/run", "CPU / MAF"],
        whole_run_rows(results),
    )
    cpu = _get(results, "whole_run", "runbus", "cpu_ms_per_run", "by_process")
    if cpu:
        out += ["CPU ms per run by process: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())]
        out += [""]
    out += throughput_section(results)
    out += scaling_section(results)
    streaming = _get(results, "streaming")
    if streaming:
        direct, bus = streaming["direct"], streaming["bus"]
        out += ["## 5. Streaming: time to the first text delta (µs)", ""]
        out += _table(
            ["path", "p50", "p99", "added p50", "added p99"],
            [
                [
                    "backend called directly",
                    f"{direct['p50_us']:.0f}",
                    f"{direct['p99_us']:.0f}",
                    "",
                    "",
                ],
                [
                    "run.text_delta at a bus subscriber",
                    f"{bus['p50_us']:.0f}",
                    f"{bus['p99_us']:.0f}",
                    f"+{bus['p50_us'] - direct['p50_us']:.0f}",
                    f"+{bus['p99_us'] - direct['p99_us']:.0f}",
                ],
            ],
        )
    out += resume_section(results)
    profile = _get(results, "profile")
    if profile:
        out += [
            "## Gateway profile",
            "",
            f"pyinstrument (wall clock) over the gateway process while it served "
            f"{profile['runs']} sequential runs (and its start and drain): "
            f"{profile['wall_s']:.1f} s wall, {profile['cpu_s']:.1f} s CPU; the call tree is "
            f"`{profile['profile']}`. Functions by their own time inside the event loop (the "
            "first row, the loop's own, is mostly waiting for the network):",
            "",
            "```",
            *profile["top_self_time"],
            "```",
            "",
        ]
    for name, text in (results.get("sections") or {}).items():
        out += [f"## {name} (printed by bench/{name}.py)", "", "```", text.rstrip(), "```", ""]
    return "\n".join(out)


def messages_section(results: dict[str, Any]) -> list[str]:
    """Messages of one run on the services' account, by kind and by hop subject."""
    messages = _get(results, "whole_run", "messages") or {}
    if not messages:
        return []
    kinds = messages.get("by_kind") or {}
    hops = messages.get("hops_by_subject") or {}
    other = messages.get("kv_and_other_by_subject") or {}
    return [
        f"Messages per run on the services' account ({messages.get('runs', '?')} sequential "
        "runs counted apart from the timed ones, by a subscription to every subject): "
        + ", ".join(f"{count(v)} {k}" for k, v in kinds.items() if v)
        + ". Request/reply hops by subject: "
        + (", ".join(f"`{k}` {count(v)}" for k, v in hops.items()) or "none")
        + (
            ". KV writes and other messages: "
            + ", ".join(f"`{k}` {count(v)}" for k, v in other.items())
            if other
            else ""
        )
        + ".",
        "",
    ]


def overhead_section(results: dict[str, Any]) -> list[str]:
    """Where one run's time beyond the model's goes, part by part."""
    overhead = _get(results, "overhead") or {}
    parts = overhead.get("parts_ms") or {}
    if not parts:
        return []
    total = overhead.get("overhead_p50_ms")
    latency = overhead.get("latency_ms", 300.0)
    model = overhead.get("model_server") or {}
    out = [
        f"## Overhead of one run at a {latency:.0f} ms model, part by part",
        "",
        f"{overhead.get('runs', '?')} runs one at a time on the six-process stack, every process "
        "exporting its spans (console exporter, read back from the logs), each run cut along "
        f"its critical path (bench/overhead.py). Overhead p50 {ms(total)} ms beyond "
        f"{MODEL_CALLS} x {latency:.0f} ms with the exporters on; the parts are medians over "
        "the runs, so they need not add up exactly.",
        "",
    ]
    if model:
        out += [
            f"The model server's own share of a call: p50 {ms(model.get('late_p50_ms'))} ms past "
            f"the {latency:.0f} ms (body in → answer out), {ms(model.get('cpu_ms_per_call'))} ms "
            "CPU.",
            "",
        ]
    return out + _table(
        ["part", "ms per run", "share of the overhead"],
        [
            [name, ms(value), "-" if not total else f"{value / total:.0%}"]
            for name, value in parts.items()
        ],
    )


ANCHORS = (
    ("langgraph_memory", "LangGraph, in-memory saver"),
    ("langgraph_sqlite", "LangGraph + SQLite"),
    ("langgraph_postgres", "LangGraph + Postgres (fsync on)"),
)


def durable_sections(results: dict[str, Any]) -> list[str]:
    out = [
        "The machine is shared (2 cores, other work running while this ran): absolute numbers "
        "move from run to run; the ratios above come from numbers taken side by side in this "
        "one run.",
        "",
    ]
    out += anchors_section(results)
    out += slow_model_section(results)
    out += overhead_section(results)
    out += session_section(results)
    out += memory_section(results)
    out += missed_section(results)
    return out


def anchors_section(results: dict[str, Any]) -> list[str]:
    anchors = _get(results, "anchors") or {}
    runbus = _get(results, "whole_run", "runbus") or {}
    maf = _get(results, "maf") or {}
    if not anchors:
        return []
    rows = []
    entries = [("maf", "MAF in process (not durable)", maf)]
    entries += [(key, name, anchors.get(key) or {}) for key, name in ANCHORS]
    pg_cpu = _get(anchors, "langgraph_postgres", "cpu_ms_per_run")
    pg_cpu64 = (_get(anchors, "langgraph_postgres", "cpu_ms_per_run_by_clients") or {}).get("64")
    for _, name, point in entries:
        if not point:
            continue
        rates = point.get("runs_per_s") or {}
        loaded = point.get("cpu_ms_per_run_by_clients") or {}
        rows.append(
            [
                name,
                ms(point.get("p50_ms")),
                ms(point.get("cpu_ms_per_run")),
                " / ".join(f"{rates[c]:.0f}" for c in sorted(rates, key=int)),
                " / ".join(ms(loaded[c]) for c in sorted(loaded, key=int)) or "-",
                times(ratio(point.get("cpu_ms_per_run"), pg_cpu)),
                times(ratio(loaded.get("64"), pg_cpu64)),
            ]
        )
    if runbus:
        cpu = (runbus.get("cpu_ms_per_run") or {}).get("total")
        points = _get(results, "throughput", "1") or {}
        rates = {c: p["runs_per_s"] for c, p in points.items()}
        loaded = {c: p["cpu_ms_per_run"] for c, p in points.items() if "cpu_ms_per_run" in p}
        rows.append(
            [
                "runbus, six processes (1 gateway)",
                ms(runbus.get("p50_ms")),
                ms(cpu),
                " / ".join(f"{rates[c]:.0f}" for c in sorted(rates, key=int)),
                " / ".join(ms(loaded[c]) for c in sorted(loaded, key=int)) or "-",
                times(ratio(cpu, pg_cpu)),
                times(ratio(loaded.get("64"), pg_cpu64)),
            ]
        )
    out = [
        "## Durable anchors: the same 3-tool run, zero-latency model",
        "",
        "LangGraph 1.x, its agent graph (model node, `ToolNode`, `tools_condition`), a thread "
        'per run, `durability="sync"` (each step\'s checkpoint written before the next step '
        "starts), each saver in its own process; Postgres started by the bench from the "
        "machine's binaries with fsync on, its server CPU counted in the run's cost.",
        "",
    ]
    if anchors.get("langgraph_postgres_skipped"):
        out += [f"LangGraph + Postgres skipped: {anchors['langgraph_postgres_skipped']}", ""]
    out += [
        "CPU ms/run is that of runs one at a time; the next column is over the rounds of the "
        "runs/s at each number of clients, where a system's requests overlap (runbus's "
        "processes then wake once for several messages, and one message costs each of them "
        "less).",
        "",
    ]
    return out + _table(
        [
            "",
            "p50 ms",
            "CPU ms/run",
            "runs/s at 1 / 8 / 64 clients",
            "CPU ms/run at 1 / 8 / 64 clients",
            "CPU / LangGraph+PG",
            "at 64 clients",
        ],
        rows,
    )


SLOW = (
    ("runbus", "runbus, six processes"),
    ("langgraph_memory", "LangGraph, in-memory"),
    ("langgraph_postgres", "LangGraph + Postgres"),
)


def slow_model_section(results: dict[str, Any]) -> list[str]:
    slow = _get(results, "slow_model") or {}
    if not slow:
        return []
    rows = []
    for level in slow.get("levels", []):
        for key, name in SLOW:
            point = (slow.get(key) or {}).get(str(level))
            if not point:
                continue
            peak = point["peak_rss_mib"]
            rows.append(
                [
                    str(level),
                    name,
                    f"{point['runs_per_s']:.1f}",
                    str(point["failures"]),
                    ms(point["p50_ms"]),
                    ms(point["p99_ms"]),
                    f"{point['cpu_ms_per_run']:.1f}",
                    f"{sum(peak.values()):.0f}",
                    ", ".join(f"{k} {v:.0f}" for k, v in peak.items()),
                ]
            )
    out = [
        f"## A {slow.get('latency_ms', 300):.0f} ms model: runs in flight",
        "",
        "A loopback OpenAI-compatible server in its own process answers every call after "
        f"{slow.get('latency_ms', 300):.0f} ms (streamed); runbus's model_router calls it "
        "over HTTP with msgspec, LangGraph's model node with the openai SDK. runbus: one "
        "gateway allowed "
        "1000 runs at once. Peak RSS is each process's high-water mark during the level "
        "(reset before it); the client's is not counted.",
        "",
    ]
    if slow.get("rounds"):
        out += [
            f"The systems take turns round by round; at 1 and {max(slow.get('levels') or [0])} "
            f"in flight a point is the median of {slow['rounds']} rounds (runs/s of each round "
            "in the second table), failures are summed over them.",
            "",
        ]
    if slow.get("langgraph_postgres_skipped"):
        out += [f"LangGraph + Postgres skipped: {slow['langgraph_postgres_skipped']}", ""]
    out += _table(
        [
            "in flight",
            "",
            "runs/s",
            "failed",
            "p50 ms",
            "p99 ms",
            "CPU ms/run",
            "peak RSS MiB",
            "by process",
        ],
        rows,
    )
    return out + slow_bound_section(slow)


def slow_bound_section(slow: dict[str, Any]) -> list[str]:
    """What bounds each level: the model server's own account and runbus's busiest processes."""
    rows = []
    for level in slow.get("levels", []):
        for key, name in SLOW:
            point = (slow.get(key) or {}).get(str(level))
            if not point or "model_server" not in point:
                continue
            model = point["model_server"]
            cores = point.get("cores_by_process") or {}
            busiest = sorted(cores.items(), key=lambda item: -item[1])[:3]
            rows.append(
                [
                    str(level),
                    name,
                    " / ".join(f"{r:.1f}" for r in point.get("rounds_runs_per_s") or []),
                    f"{model.get('cores', 0.0):.2f}",
                    ms(model["cpu_ms_per_call"]),
                    ms(model["late_p99_ms"]),
                    ms(model["body_p99_ms"]),
                    ms(model["lag_p99_ms"]),
                    ", ".join(f"{k} {v:.2f}" for k, v in busiest) or "-",
                ]
            )
    if not rows:
        return []
    return [
        "What bounds a level: the model server's own account of each round (cores busy; CPU "
        "per call, its 100 Hz lag watcher included, which dominates at 1 in flight; how "
        "late it answered past the latency, counted from the request body in; how long the "
        "caller took to send the body after its headers; its event loop's lag) and the "
        "busiest processes in cores (one Python event loop tops out at 1; the client's CPU "
        "counts in runbus's, LangGraph's runs in its own process).",
        "",
        *_table(
            [
                "in flight",
                "",
                "runs/s by round",
                "model server cores",
                "its CPU ms/call",
                "answered late p99 ms",
                "caller's body p99 ms",
                "loop lag p99 ms",
                "busiest processes, cores",
            ],
            rows,
        ),
    ]


def session_section(results: dict[str, Any]) -> list[str]:
    session = _get(results, "session_length") or {}
    if not session:
        return []
    runs = session["runs"]
    rows = []
    for key, name in (
        ("windowed", "compaction policy, prompt copy only"),
        ("persisted", "same policy, `persist = true`"),
    ):
        point = session.get(key) or {}
        if point:
            rows.append(
                [
                    name,
                    ms(point["first_ms"]),
                    ms(point["last_ms"]),
                    times(point["last_over_first"]),
                ]
            )
    return [
        "## Session length: run cost at run 1 and run " + str(runs),
        "",
        f"Runs 1…{runs} of one session ({session['rounds']} sessions per variant, advanced in "
        "lockstep), the 3-tool run (8 messages stored per run), a sliding window of "
        f"{session['window_turns']} turns. Medians of the first and last 5 runs.",
        "",
        *_table(["agent", "runs 1-5 ms", f"runs {runs - 4}-{runs} ms", "last / first"], rows),
    ]


def memory_section(results: dict[str, Any]) -> list[str]:
    rss = _get(results, "rss_mib") or {}
    if not rss:
        return []
    return [
        "## Resident memory of the stack (MiB, after the sequential runs)",
        "",
        *_table(list(rss), [[f"{v:.0f}" for v in rss.values()]]),
    ]


def missed_section(results: dict[str, Any]) -> list[str]:
    """For the durable targets missed: where runbus's cost goes (the profile by process and
    the gateway's own functions), next to the anchor's, and what would close the gap."""
    missed = [t for t in durable_targets(results) if t.met is False]
    if not missed:
        return []
    out = ["## Missed targets: why, and what would close them", ""]
    by_process = _get(results, "whole_run", "runbus", "cpu_ms_per_run", "by_process") or {}
    client = _get(results, "whole_run", "runbus", "cpu_ms_per_run", "client")
    pg = _get(results, "anchors", "langgraph_postgres", "cpu_ms_by_process") or {}
    hops = _get(results, "whole_run", "hops_per_run")
    events = _get(results, "whole_run", "events_per_run")
    names = {t.name for t in missed}
    if by_process and any("CPU" in n or "runs/s" in n for n in names):
        ranked = sorted(by_process.items(), key=lambda item: -item[1])
        parts = ", ".join(f"{k} {v:.1f}" for k, v in ranked)
        kinds = _get(results, "whole_run", "messages", "by_kind") or {}
        messages = sum(kinds.values()) if kinds else None
        cpu64 = _get(results, "throughput", "1", "64", "cpu_ms_per_run")
        pg64 = _get(results, "anchors", "langgraph_postgres", "cpu_ms_per_run_by_clients") or {}
        out += [
            f"- **CPU per run** (the throughput targets follow from it on 2 cores): runbus "
            f"spends it as {parts}, client {ms(client)} ms; LangGraph + Postgres as anchor "
            f"{ms(pg.get('anchor'))} + database {ms(pg.get('database'))} ms. A run puts "
            f"{count(messages)} messages on the services' bus ({count(hops)} request/reply "
            f"hops, {count(events)} run events, the stored writes and their acks counted "
            "above). Run one at a time, every message wakes a sleeping process at each end and "
            "nats-server, and on this machine the wake-ups cost more than the work: the same "
            f"runs at 64 clients, where one wake-up carries several messages, cost "
            f"{ms(cpu64)} ms each (LangGraph + Postgres {ms(pg64.get('64'))} ms). Already "
            "taken (each measured on its own when it landed): one history checkpoint per step, "
            "written by the gateway straight into the history stream; clients following a run "
            "by a plain subscription; no compaction hop under the trigger; the tool catalogue "
            "cached per agent; OpenTelemetry non-recording without an exporter; `gc.freeze()` "
            "after start; model_router's provider path on msgspec over HTTP; progress-aware "
            "calls on one subscription per connection, with no heartbeat before 0.5 s; KV "
            "reads by direct get; one JetStream context per connection (a context per event "
            "had left a subscription behind each); nats-server on one Go thread; a new "
            "session opened without reading what is stored under its id; a side-effecting call "
            "claimed without a lookup on its first send. What is left "
            "for runs one at a time is the count of messages itself, most of them what the "
            "run's durability costs: the checkpoint before tools, every event stored and "
            "acked, the run and session records, the side-effecting tool's record. Halving it "
            "needs fewer stored writes per run (an ack per event is the largest share), not "
            "cheaper code. The gateway's own profile is below (`gateway_profile.txt`).",
        ]
    slow = _get(results, "slow_model") or {}
    if any("in flight vs" in n for n in names) and slow:
        top = str(max(slow.get("levels") or [0]))
        for key, label in SLOW:
            point = (slow.get(key) or {}).get(top) or {}
            if point.get("failures"):
                kinds = "; ".join(point.get("failure_kinds") or [])
                runs = point.get("runs", "?")
                out += [
                    f"- **{label} at {top} in flight**: {point['failures']} of {runs} "
                    f"runs failed ({kinds}). A client follows each run with its own JetStream "
                    "consumer on the events stream, so a thousand followed runs are a thousand "
                    "consumers; following by a plain subscription (replay only after a gap) "
                    "removes that limit and the consumer's cost.",
                ]
        rb = (slow.get("runbus") or {}).get(top) or {}
        if rb:
            out += [_slow_bound_bullet(top, rb)]
    if any("overhead" in n for n in names):
        by_part: dict[str, float] = _get(results, "overhead", "parts_ms") or {}
        first = ", ".join(f"{part} {ms(value)} ms" for part, value in list(by_part.items())[:3])
        out += [
            "- **Overhead of one run at 300 ms**: "
            + (
                f"the largest parts of runbus's overhead per run are {first} (the table above)."
                if first
                else "not broken down in this run (the `overhead` section)."
            )
            + " LangGraph's own four openai SDK calls are inside its overhead too; runbus adds "
            "a bus round trip and a handler for every model call, tool call and history append.",
        ]
    if any("RSS" in n for n in names):
        out += [
            "- **Memory**: the memory service holds its embedder and vector store even when no "
            "agent uses memory; loading them on first use (lazily) keeps an unused memory "
            "service small, and the other services are mostly the interpreter plus imports.",
        ]
    if any("session" in n for n in names):
        out += [
            "- **Session length**: with `persist = true` a run loads the latest compaction plus "
            "what came after, so run 100 costs what any run past the window costs; it still does "
            "more than run 1: a prompt of the window's turns shipped through each hop, one "
            "compaction hop (the window moves once per run), its `run.compacted` event, and the "
            "compaction's append through the history service. Run 1 of a new session also stores "
            "its first checkpoint straight into the stream, so the ratio's base is the cheapest "
            "run there is; a smaller window or a token trigger bounds run 100 further.",
        ]
    return [*out, ""]


def _slow_bound_bullet(top: str, rb: dict[str, Any]) -> str:
    """What the runbus level at `top` in flight spent, and where the model server stood."""
    cores = rb.get("cores_by_process") or {}
    busy = sum(cores.values())
    text = (
        f"- **Runs/s at {top} in flight**: {rb['runs_per_s']:.1f} runs/s x "
        f"{rb['cpu_ms_per_run']:.0f} ms CPU per run = "
        f"{rb['runs_per_s'] * rb['cpu_ms_per_run'] / 1000:.2f} cores busy on a 2-core machine "
        "shared with other work"
    )
    if cores:
        name, most = max(cores.items(), key=lambda item: item[1])
        text += (
            f"; the busiest process, {name}, at {most:.2f} cores ({most / busy:.0%} of "
            "runbus's), runs one event loop: a second replica of it, or a cheaper call path "
            "in it, is what raises the ceiling"
        )
    model = rb.get("model_server") or {}
    if model:
        text += (
            f". The model server: {model.get('cores', 0.0):.2f} cores, "
            f"{ms(model['cpu_ms_per_call'])} ms CPU per call, answered p99 "
            f"{ms(model['late_p99_ms'])} ms "
            f"past the latency, while its callers took p99 {ms(model['body_p99_ms'])} ms to "
            "send a request body after its headers"
        )
    return text + "."


def resume_section(results: dict[str, Any]) -> list[str]:
    processes = _get(results, "resume")
    lowered = _get(results, "resume_in_process")
    if not processes and not lowered:
        return []
    out = ["## Resume: a run whose gateway died", ""]
    if processes:
        out += [
            f"Processes: the gateway SIGKILLed while the run waited on a 1 s tool, a new gateway "
            f"started at once (ready after {processes['new_gateway_ready_s']:.1f} s): "
            f"**{processes['kill_to_completed_s']:.1f} s** from the kill to `run.completed`, "
            f"with the gateway's ack_wait of {processes['ack_wait_s']:g} s "
            "(`RUNBUS_RUN_ACK_WAIT`, left at its default).",
            "",
        ]
    if lowered:
        rest = lowered["kill_to_completed_s"] - lowered["ack_wait_s"] - lowered["tool_s"]
        out += [
            f"In process, ack_wait lowered to {lowered['ack_wait_s']:g} s, the gateway's "
            "connection closed while the run waited on a tool of "
            f"{lowered['tool_s']:g} s, a new replica started just before: median "
            f"**{lowered['kill_to_completed_s']:.2f} s** over {len(lowered['trials'])} kills; "
            f"{rest:+.2f} s beyond ack_wait + the tool call repeated (the redelivery comes "
            "ack_wait after the last `in_progress`, which is sent every ack_wait / 3).",
            "",
        ]
    return out


def throughput_section(results: dict[str, Any]) -> list[str]:
    gateways = _get(results, "throughput") or {}
    maf_rates = _get(results, "maf", "runs_per_s") or {}
    if not gateways:
        return []
    out = ["## 4. Throughput: runs/s and run latency by clients and gateway replicas", ""]
    one = gateways.get("1", {})
    rows = []
    for replicas, points in gateways.items():
        for clients, point in points.items():
            rows.append(
                [
                    replicas,
                    clients,
                    f"{point['runs_per_s']:.1f}",
                    times(ratio(point["runs_per_s"], one.get(clients, {}).get("runs_per_s"))),
                    times(ratio(point["runs_per_s"], maf_rates.get(clients))),
                    ms(point["p50_ms"]),
                    ms(point["p99_ms"]),
                ]
            )
    return out + _table(
        ["gateways", "clients", "runs/s", "vs 1 gateway", "vs MAF", "p50 ms", "p99 ms"], rows
    )


def scaling_section(results: dict[str, Any]) -> list[str]:
    points = _get(results, "tool_scaling") or []
    if not points:
        return []
    base = points[0]["calls_per_s"]
    out = ["## 4. tool_executor scaling: 50 ms I/O tool, 128 calls in flight", ""]
    return out + _table(
        ["replicas", "calls/s", "vs 1 replica", "ideal", "of ideal", "p50 ms", "p99 ms"],
        [
            [
                str(p["replicas"]),
                f"{p['calls_per_s']:.0f}",
                times(ratio(p["calls_per_s"], base)),
                f"{p['ideal']:.0f}",
                f"{p['calls_per_s'] / p['ideal']:.0%}",
                ms(p["p50_ms"]),
                ms(p["p99_ms"]),
            ]
            for p in points
        ],
    )


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    """tool_scaling.png, throughput.png and whole_run.png, for what was measured."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    points = _get(results, "tool_scaling") or []
    if points:
        fig, ax = plt.subplots(figsize=(6, 4))
        replicas = [p["replicas"] for p in points]
        ax.plot(replicas, [p["calls_per_s"] for p in points], "o-", label="measured")
        ax.plot(replicas, [p["ideal"] for p in points], "--", label="ideal (slots / 50 ms)")
        ax.set(xlabel="tool_executor replicas", ylabel="calls/s", xticks=replicas)
        ax.set_title("50 ms I/O tool, 128 calls in flight")
        ax.legend()
        written.append(_save(fig, out / "tool_scaling.png"))
    gateways = _get(results, "throughput") or {}
    if gateways:
        fig, ax = plt.subplots(figsize=(6, 4))
        for replicas, by_clients in gateways.items():
            clients = [int(c) for c in by_clients]
            rates = [p["runs_per_s"] for p in by_clients.values()]
            ax.plot(clients, rates, "o-", label=f"runbus, {replicas} gateway(s)")
        maf = _get(results, "maf", "runs_per_s") or {}
        if maf:
            ax.plot([int(c) for c in maf], list(maf.values()), "s:", label="MAF in process")
        for key, name in ANCHORS:
            anchor = _get(results, "anchors", key, "runs_per_s") or {}
            if anchor:
                ax.plot([int(c) for c in anchor], list(anchor.values()), "^:", label=name)
        ax.set(xlabel="concurrent clients", ylabel="runs/s", xscale="log", yscale="log")
        ax.set_xticks([int(c) for c in next(iter(gateways.values()))], minor=False)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title("3-tool scripted run")
        ax.legend()
        written.append(_save(fig, out / "throughput.png"))
    slow = _get(results, "slow_model") or {}
    if slow:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, name in SLOW:
            points = slow.get(key) or {}
            if points:
                levels = [int(level) for level in points]
                ax.plot(levels, [p["runs_per_s"] for p in points.values()], "o-", label=name)
        ax.set(xlabel="runs in flight", ylabel="runs/s", xscale="log", yscale="log")
        ax.set_xticks([int(level) for level in slow.get("levels", [])], minor=False)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"3-tool run, {slow.get('latency_ms', 300):.0f} ms model")
        ax.legend()
        written.append(_save(fig, out / "runs_in_flight.png"))
    session = _get(results, "session_length") or {}
    if session:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, name in (("windowed", "prompt copy only"), ("persisted", "persist = true")):
            point = session.get(key) or {}
            if point:
                runs = range(1, len(point["run_ms"]) + 1)
                ax.plot(runs, point["run_ms"], ".-", label=name, linewidth=1)
        ax.set(xlabel="run of the session", ylabel="ms per run (median of sessions)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"run cost against session length, window of {session['window_turns']} turns")
        ax.legend()
        written.append(_save(fig, out / "session_length.png"))
    rows = whole_run_rows(results)
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3))
        names = [r[0] for r in rows]
        at = range(len(rows))
        ax.barh([y + 0.2 for y in at], [float(r[1]) for r in rows], height=0.4, label="p50")
        ax.barh([y - 0.2 for y in at], [float(r[2]) for r in rows], height=0.4, label="p99")
        ax.set_yticks(list(at), names)
        ax.set(xlabel="ms per run")
        ax.set_title("one 3-tool run, zero-latency scripted model")
        ax.legend()
        written.append(_save(fig, out / "whole_run.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(results: dict[str, Any], out: Path = RESULTS) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    (out / "results.md").write_text(markdown(results))
    return [out / "results.json", out / "results.md", *plots(results, out)]
