"""The cluster suite: one cluster of network namespaces per module, sizes and the report.

`make test` runs the short size (one fault, a few runs); `make jepsen` sets
`RUNBUS_JEPSEN=full` for every fault at full size and `RUNBUS_JEPSEN_REPORT=<path>`, where
the session writes the counted table as markdown, headed by the commit it was measured on.
"""

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest

from tests.cluster.harness import Cluster, running_cluster
from tests.cluster.network import PREFIX
from tests.helpers import measured_commit

FULL = os.environ.get("RUNBUS_JEPSEN") == "full"

N = TypeVar("N", int, float)


def jepsen_size(short: N, full: N) -> N:
    return full if FULL else short


@dataclass
class ClusterReport:
    rows: list[dict[str, object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [
            "# runbus on a three-node cluster, under faults",
            "",
            f"Commit `{measured_commit()}`, measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with "
            f"`{'make jepsen' if FULL else 'make test'}` (tests/cluster): three hosts as "
            "network namespaces, each a nats-server node of deploy/nats/cluster.conf and "
            "runbus services, a fourth host for the client. Counts are per fault.",
        ]
        if self.rows:
            columns = list(dict.fromkeys(key for row in self.rows for key in row))
            lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += [
                "| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in self.rows
            ]
        if self.notes:
            lines += ["", "## Notes", ""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def cluster_report() -> Iterator[ClusterReport]:
    report = ClusterReport()
    yield report
    target = os.environ.get("RUNBUS_JEPSEN_REPORT")
    if target and report.rows:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(report.markdown())


@pytest.fixture(scope="module")
async def cluster(cluster_report: ClusterReport) -> AsyncIterator[Cluster]:
    # Not pytest's tmp_path: other sessions on the machine rotate it away, and the services'
    # logs under it are what explains a failure. The next run removes it (`remove_stale`).
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    cluster_report.notes.append(f"logs and data under {root}")
    async with running_cluster(root) as running:
        cluster_report.notes.append(
            f"cluster up (3 nodes, 16 services) in {running.started_in:.1f}s"
        )
        cluster_report.notes += running.start_notes
        yield running
