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


def ratio(value: float | None, base: float | None) -> float | None:
    """`value / base`, or None when either is missing or the base is not positive."""
    if value is None or base is None or base <= 0 or math.isnan(value):
        return None
    return value / base


def times(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


@dataclass(frozen=True)
class Target:
    name: str
    measured: float | None
    """The ratio measured."""
    limit: float
    at_least: bool
    """True when the ratio must reach `limit` (scaling), False when it must stay under it."""
    basis: str
    """How the ratio was formed, in words, with its absolute numbers."""

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        return self.measured >= self.limit if self.at_least else self.measured <= self.limit

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**missed**", None: "not measured"}[self.met]


def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def targets(results: dict[str, Any]) -> list[Target]:
    """The three targets runbus holds itself to (per-hop overhead, whole run, tool scaling),
    each from numbers of this one run."""
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
            basis=f"run {ms(run)} ms / ({hops} hops x {ms(floor)} ms = {ms(run_floor)} ms)",
        ),
        Target(
            "tool scaling at 4 replicas",
            ratio(points.get(4), points.get(1)),
            SCALING_AT_4,
            at_least=True,
            basis=f"{points.get(4, 0):.0f} calls/s / {points.get(1, 0):.0f} calls/s at 1",
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
        "## Targets",
        "",
    ]
    out += _table(
        ["target", "measured", "limit", "verdict", "from"],
        [
            [
                t.name,
                times(t.measured),
                ("≥ " if t.at_least else "≤ ") + f"{t.limit:g}x",
                t.verdict,
                t.basis,
            ]
            for t in targets(results)
        ],
    )
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
        f"Per run: {hops} request/reply hops and {events} run events published to JetStream "
        f"(the run request is one more). Floor of the hops alone: {hops} x {ms(rr_p50)} ms; "
        f"with the event publishes at the JetStream floor, {ms(fuller)} ms, which the "
        f"six-process run takes {times(ratio(run_p50, fuller))} of. CPU per run is the sum over "
        "every process (services, nats-server, client) for runbus, the one process for MAF.",
        "",
    ]
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
            f"with the gateway's ack_wait of {processes['ack_wait_s']:g} s (not settable from "
            "the environment, so the processes run with the default).",
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
        ax.set(xlabel="concurrent clients", ylabel="runs/s", xscale="log", yscale="log")
        ax.set_xticks([int(c) for c in next(iter(gateways.values()))], minor=False)
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title("3-tool scripted run")
        ax.legend()
        written.append(_save(fig, out / "throughput.png"))
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
