"""How the report writes a number, a ratio and a Markdown table."""

import math

from bench.results import Latency


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


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def latency_row(name: str, point: Latency | None, base: Latency | None) -> list[str]:
    """p50 and p99 of `point`, each next to its ratio to `base`'s."""
    p50, p99 = (point.p50_ms, point.p99_ms) if point else (None, None)
    base50, base99 = (base.p50_ms, base.p99_ms) if base else (None, None)
    return [name, ms(p50), times(ratio(p50, base50)), ms(p99), times(ratio(p99, base99))]
