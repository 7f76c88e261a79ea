"""Chaos and fuzz suites: counted results, not just pass/fail.

Every test here records what it counted with `chaos_report.record(table, row)`. `make test`
runs the short sizes (a few runs per case, so the suite stays quick); `make chaos` sets
`RUNBUS_CHAOS=full` for the full sizes (100 runs per case) and
`RUNBUS_CHAOS_REPORT=<path>`, and the session then writes the counted tables as markdown
there, headed by the commit they were measured on.
"""

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest

from tests.helpers import measured_commit

FULL = os.environ.get("RUNBUS_CHAOS") == "full"


N = TypeVar("N", int, float)


def chaos_size(short: N, full: N) -> N:
    """How many runs, payloads or kills a case uses: `full` under `make chaos`."""
    return full if FULL else short


@dataclass
class ChaosReport:
    """Rows of counted outcomes, one table per concern (kill matrix, fuzz, isolation, ...)."""

    tables: dict[str, list[dict[str, object]]] = field(default_factory=dict)

    def record(self, table: str, row: dict[str, object]) -> None:
        self.tables.setdefault(table, []).append(row)

    def markdown(self) -> str:
        lines = [
            "# runbus chaos and fuzz results",
            "",
            f"Commit `{measured_commit()}`, measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
            f"sizes: {'full (`make chaos`)' if FULL else 'short (`make test`)'}.",
        ]
        for table, rows in self.tables.items():
            columns = list(dict.fromkeys(key for row in rows for key in row))
            lines += ["", f"## {table}", "", "| " + " | ".join(columns) + " |"]
            lines.append("|" + "---|" * len(columns))
            for row in rows:
                lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def chaos_report() -> Iterator[ChaosReport]:
    report = ChaosReport()
    yield report
    target = os.environ.get("RUNBUS_CHAOS_REPORT")
    if target and report.tables:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(report.markdown())
