"""The report's section on a 300 ms model: each system at each level of runs in flight, and
what bounds each level."""

from bench.report.cells import ms, table
from bench.results import Results, SlowModel, SlowSystem

SLOW: tuple[tuple[SlowSystem, str], ...] = (
    ("runbus", "runbus, six processes"),
    ("langgraph_memory", "LangGraph, in-memory"),
    ("langgraph_postgres", "LangGraph + Postgres"),
)


def slow_model_section(results: Results) -> list[str]:
    slow = results.slow_model
    if slow is None:
        return []
    rows = []
    for level in slow.levels:
        for key, name in SLOW:
            point = slow.points(key).get(str(level))
            if point is None:
                continue
            peak = point.peak_rss_mib
            rows.append(
                [
                    str(level),
                    name,
                    f"{point.runs_per_s:.1f}",
                    str(point.failures),
                    ms(point.p50_ms),
                    ms(point.p99_ms),
                    f"{point.cpu_ms_per_run:.1f}",
                    f"{sum(peak.values()):.0f}",
                    ", ".join(f"{k} {v:.0f}" for k, v in peak.items()),
                ]
            )
    out = [
        f"## A {slow.latency_ms:.0f} ms model: runs in flight",
        "",
        "A loopback OpenAI-compatible server in its own process answers every call after "
        f"{slow.latency_ms:.0f} ms (streamed); runbus's model_router calls it "
        "over HTTP with msgspec, LangGraph's model node with the openai SDK. runbus: one "
        "gateway allowed "
        "1000 runs at once. Peak RSS is each process's high-water mark during the level "
        "(reset before it); the client's is not counted.",
        "",
    ]
    if slow.rounds:
        out += [
            f"The systems take turns round by round; at 1 and {max(slow.levels or [0])} "
            f"in flight a point is the median of {slow.rounds} rounds (runs/s of each round "
            "in the second table), failures are summed over them.",
            "",
        ]
    if slow.langgraph_postgres_skipped:
        out += [f"LangGraph + Postgres skipped: {slow.langgraph_postgres_skipped}", ""]
    out += table(
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


def slow_bound_section(slow: SlowModel) -> list[str]:
    """What bounds each level: the model server's own account and runbus's busiest processes."""
    rows = []
    for level in slow.levels:
        for key, name in SLOW:
            point = slow.points(key).get(str(level))
            if point is None or point.model_server is None:
                continue
            model = point.model_server
            busiest = sorted(point.cores_by_process.items(), key=lambda item: -item[1])[:3]
            rows.append(
                [
                    str(level),
                    name,
                    " / ".join(f"{r:.1f}" for r in point.rounds_runs_per_s),
                    f"{model.cores:.2f}",
                    ms(model.cpu_ms_per_call),
                    ms(model.late_p99_ms),
                    ms(model.body_p99_ms),
                    ms(model.lag_p99_ms),
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
        *table(
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
