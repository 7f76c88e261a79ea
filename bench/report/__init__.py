"""`make bench`'s output: results.json (every number, the machine, the commit), results.md
(tables with each ratio next to the absolute numbers it comes from, targets met or missed) and
the PNG plots, all under bench/results/. One module per part of results.md."""

from pathlib import Path

from bench.report.cells import table
from bench.report.durable import durable_sections
from bench.report.runs import (
    floor_section,
    held_deltas_section,
    printed_sections,
    profile_section,
    resume_section,
    scaling_section,
    streaming_section,
    throughput_section,
    whole_run_section,
)
from bench.report.targets import Target, targets
from bench.results import Results, encode

RESULTS = Path(__file__).resolve().parent.parent / "results"

__all__ = ["RESULTS", "Target", "markdown", "targets", "write"]


def markdown(results: Results) -> str:
    meta = results.meta
    machine = meta.machine
    out = [
        "# runbus benchmark results",
        "",
        f"{meta.timestamp}, commit `{meta.commit}`"
        f"{' (uncommitted changes)' if meta.dirty else ''}, "
        f"{machine.cpus} CPUs ({machine.cpu_model}), "
        f"Python {machine.python}, {'quick' if meta.quick else 'full'} run. "
        "Every comparison below was measured in this one process run on this machine; p50 is "
        "the median of the repeated trials. Ratios sit next to the numbers they divide.",
        "",
        "Sections measured: " + ", ".join(meta.completed_sections or ["?"]) + ".",
        "",
        "## Targets",
        "",
    ]
    out += table(
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
    out += floor_section(results)
    out += whole_run_section(results)
    out += throughput_section(results)
    out += scaling_section(results)
    out += streaming_section(results)
    out += resume_section(results)
    out += profile_section(results)
    out += held_deltas_section(results)
    out += printed_sections(results)
    return "\n".join(out)


def write(results: Results, out: Path = RESULTS) -> list[Path]:
    from bench.report.plots import plots  # matplotlib: only where a report is written

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_bytes(encode(results))
    (out / "results.md").write_text(markdown(results))
    return [out / "results.json", out / "results.md", *plots(results, out)]
