"""The report's PNG plots, for what was measured."""

from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from bench.report.durable import ANCHORS
from bench.report.runs import whole_run_rows
from bench.report.slow_model import SLOW
from bench.results import Results

matplotlib.use("Agg")


def plots(results: Results, out: Path) -> list[Path]:
    """tool_scaling.png, throughput.png, runs_in_flight.png, session_length.png and
    whole_run.png, each where its section ran."""
    written = []
    points = results.tool_scaling
    if points:
        fig, ax = plt.subplots(figsize=(6, 4))
        replicas = [p.replicas for p in points]
        ax.plot(replicas, [p.calls_per_s for p in points], "o-", label="measured")
        ax.plot(replicas, [p.ideal for p in points], "--", label="ideal (slots / 50 ms)")
        ax.set(xlabel="tool_executor replicas", ylabel="calls/s", xticks=replicas)
        ax.set_title("50 ms I/O tool, 128 calls in flight")
        ax.legend()
        written.append(_save(fig, out / "tool_scaling.png"))
    gateways = results.throughput
    if gateways:
        fig, ax = plt.subplots(figsize=(6, 4))
        for gateway_count, by_clients in gateways.items():
            clients = [int(c) for c in by_clients]
            rates = [p.runs_per_s for p in by_clients.values()]
            ax.plot(clients, rates, "o-", label=f"runbus, {gateway_count} gateway(s)")
        maf = results.maf.runs_per_s if results.maf else {}
        if maf:
            ax.plot([int(c) for c in maf], list(maf.values()), "s:", label="MAF in process")
        anchors = results.anchors
        for key, name in ANCHORS:
            anchor = getattr(anchors, key) if anchors else None
            if anchor is not None and anchor.runs_per_s:
                rates_by = anchor.runs_per_s
                ax.plot([int(c) for c in rates_by], list(rates_by.values()), "^:", label=name)
        ax.set(xlabel="concurrent clients", ylabel="runs/s", xscale="log", yscale="log")
        ax.set_xticks([int(c) for c in next(iter(gateways.values()))], minor=False)
        _plain_log_ticks(ax)
        ax.set_title("3-tool scripted run")
        ax.legend()
        written.append(_save(fig, out / "throughput.png"))
    slow = results.slow_model
    if slow:
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, name in SLOW:
            by_level = slow.points(key)
            if by_level:
                levels = [int(level) for level in by_level]
                ax.plot(levels, [p.runs_per_s for p in by_level.values()], "o-", label=name)
        ax.set(xlabel="runs in flight", ylabel="runs/s", xscale="log", yscale="log")
        ax.set_xticks(slow.levels, minor=False)
        _plain_log_ticks(ax)
        ax.set_title(f"3-tool run, {slow.latency_ms:.0f} ms model")
        ax.legend()
        written.append(_save(fig, out / "runs_in_flight.png"))
    session = results.session_length
    if session:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, variant in (
            ("prompt copy only", session.windowed),
            ("persist = true", session.persisted),
        ):
            if variant:
                runs = range(1, len(variant.run_ms) + 1)
                ax.plot(runs, variant.run_ms, ".-", label=name, linewidth=1)
        ax.set(xlabel="run of the session", ylabel="ms per run (median of sessions)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"run cost against session length, window of {session.window_turns} turns")
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


def _plain_log_ticks(ax: Axes) -> None:
    """Ticks of a log x axis written as plain numbers, without minor labels."""
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
