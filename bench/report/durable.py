"""The report's sections against the durable anchors: LangGraph's savers at zero model
latency, the overhead of one run at a slow model, long sessions and resident memory."""

from bench.report.cells import ms, ratio, table, times
from bench.report.missed import missed_section
from bench.report.slow_model import slow_model_section
from bench.report.targets import MODEL_CALLS
from bench.results import Results, RunCost

ANCHORS = (
    ("langgraph_memory", "LangGraph, in-memory saver"),
    ("langgraph_sqlite", "LangGraph + SQLite"),
    ("langgraph_postgres", "LangGraph + Postgres (fsync, synchronous_commit on)"),
)


def durable_sections(results: Results) -> list[str]:
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


def _cost_row(
    name: str, p50: float, cpu: float | None, rates: dict[str, float], loaded: dict[str, float]
) -> tuple[str, float | None, dict[str, float], list[str]]:
    cells = [
        name,
        ms(p50),
        ms(cpu),
        " / ".join(f"{rates[c]:.0f}" for c in sorted(rates, key=int)),
        " / ".join(ms(loaded[c]) for c in sorted(loaded, key=int)) or "-",
    ]
    return name, cpu, loaded, cells


def anchors_section(results: Results) -> list[str]:
    anchors = results.anchors
    if anchors is None:
        return []
    postgres = anchors.langgraph_postgres
    pg_cpu = postgres.cpu_ms_per_run if postgres else None
    pg_cpu64 = postgres.cpu_ms_per_run_by_clients.get("64") if postgres else None
    points: list[tuple[str, RunCost | None]] = [("MAF in process (not durable)", results.maf)]
    by_key = {
        "langgraph_memory": anchors.langgraph_memory,
        "langgraph_sqlite": anchors.langgraph_sqlite,
        "langgraph_postgres": postgres,
    }
    points += [(name, by_key[key]) for key, name in ANCHORS]
    costs = [
        _cost_row(name, p.p50_ms, p.cpu_ms_per_run, p.runs_per_s, p.cpu_ms_per_run_by_clients)
        for name, p in points
        if p is not None
    ]
    runbus = results.whole_run.runbus if results.whole_run else None
    if runbus is not None:
        one_gateway = results.throughput.get("1", {})
        costs.append(
            _cost_row(
                "runbus, six processes (1 gateway)",
                runbus.p50_ms,
                runbus.cpu_ms_per_run.total,
                {c: p.runs_per_s for c, p in one_gateway.items()},
                {
                    c: p.cpu_ms_per_run
                    for c, p in one_gateway.items()
                    if p.cpu_ms_per_run is not None
                },
            )
        )
    rows = [
        [*cells, times(ratio(cpu, pg_cpu)), times(ratio(loaded.get("64"), pg_cpu64))]
        for _, cpu, loaded, cells in costs
    ]
    out = [
        "## Durable anchors: the same 3-tool run, zero-latency model",
        "",
        "LangGraph 1.x, its agent graph (model node, `ToolNode`, `tools_condition`), a thread "
        'per run, `durability="sync"` (each step\'s checkpoint written before the next step '
        "starts), each saver in its own process; Postgres started by the bench from the "
        "machine's binaries with fsync and synchronous_commit on, its server CPU counted in "
        "the run's cost. runbus's NATS runs with `sync_interval: always` (every JetStream write "
        "on disk before it is acknowledged): both sides at equal durability.",
        "",
    ]
    if anchors.langgraph_postgres_skipped:
        out += [f"LangGraph + Postgres skipped: {anchors.langgraph_postgres_skipped}", ""]
    out += [
        "CPU ms/run is that of runs one at a time; the next column is over the rounds of the "
        "runs/s at each number of clients, where a system's requests overlap (runbus's "
        "processes then wake once for several messages, and one message costs each of them "
        "less).",
        "",
    ]
    return out + table(
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


def overhead_section(results: Results) -> list[str]:
    """Where one run's time beyond the model's goes, part by part."""
    overhead = results.overhead
    if overhead is None or not overhead.parts_ms:
        return []
    total = overhead.overhead_p50_ms
    latency = overhead.latency_ms
    model = overhead.model_server
    out = [
        f"## Overhead of one run at a {latency:.0f} ms model, part by part",
        "",
        f"{overhead.runs} runs one at a time on the six-process stack, every process "
        "exporting its spans (console exporter, read back from the logs), each run cut along "
        f"its critical path (bench/overhead.py). Overhead p50 {ms(total)} ms beyond "
        f"{MODEL_CALLS} x {latency:.0f} ms with the exporters on; the parts are medians over "
        "the runs, so they need not add up exactly.",
        "",
    ]
    if model:
        out += [
            f"The model server's own share of a call: p50 {ms(model.late_p50_ms)} ms past "
            f"the {latency:.0f} ms (body in → answer out), {ms(model.cpu_ms_per_call)} ms "
            "CPU.",
            "",
        ]
    return out + table(
        ["part", "ms per run", "share of the overhead"],
        [
            [name, ms(value), "-" if not total else f"{value / total:.0%}"]
            for name, value in overhead.parts_ms.items()
        ],
    )


def session_section(results: Results) -> list[str]:
    session = results.session_length
    if session is None:
        return []
    runs = session.runs
    rows = [
        [name, ms(point.first_ms), ms(point.last_ms), times(point.last_over_first)]
        for name, point in (
            ("compaction policy, prompt copy only", session.windowed),
            ("same policy, `persist = true`", session.persisted),
        )
        if point is not None
    ]
    return [
        "## Session length: run cost at run 1 and run " + str(runs),
        "",
        f"Runs 1…{runs} of one session ({session.rounds} sessions per variant, advanced in "
        "lockstep), the 3-tool run (8 messages stored per run), a sliding window of "
        f"{session.window_turns} turns. Medians of the first and last 5 runs.",
        "",
        *table(["agent", "runs 1-5 ms", f"runs {runs - 4}-{runs} ms", "last / first"], rows),
    ]


def memory_section(results: Results) -> list[str]:
    rss = results.rss_mib
    if not rss:
        return []
    return [
        "## Resident memory of the stack (MiB, after the sequential runs)",
        "",
        *table(list(rss), [[f"{v:.0f}" for v in rss.values()]]),
    ]
