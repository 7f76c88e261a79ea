"""Jepsen-style: each fault applied to the three-node cluster while booking runs are in
flight and others wait for a person's approval, then healed; the checker then reads
everything back and every acknowledged run must have finished exactly once, booked at most
once, left a valid history and freed its session."""

import asyncio
import json
import os
import time

import pytest

from tests.cluster.checker import check, describe, recover
from tests.cluster.conftest import FULL, ClusterReport, jepsen_size
from tests.cluster.harness import NODES, Cluster
from tests.cluster.nemesis import FAULTS, Hold
from tests.cluster.workload import Workload

# A stuck cluster fails on its own assertions (recovery times out first), not on pytest-timeout.
pytestmark = [pytest.mark.cluster, pytest.mark.subprocess, pytest.mark.timeout(300)]

RUNS = jepsen_size(6, 20)
IN_FLIGHT = jepsen_size(3, 5)
APPROVALS = jepsen_size(1, 2)
WARM_UP = jepsen_size(2, 4)
"""Runs finished before the fault begins, so it lands on a load in full swing."""
HOLD = Hold(runs=jepsen_size(1, 4), at_most=jepsen_size(8.0, 30.0))
RECOVER_WITHIN = jepsen_size(60.0, 120.0)
SHORT = ("minority-split",)
"""The fault of `make test`: the one whose guarantee is subtle (a minority must not
complete what the majority did not accept); `make jepsen` runs them all, and
`RUNBUS_JEPSEN_FAULTS=node-killed,node-paused` the ones it names."""
KNOWN = {
    "text after the final one": "known limit (docs/guarantees.md): a model reply already "
    "streaming when its delivery was cut off lands text deltas after the run's final event",
    "messages stored twice": "open gap (docs/guarantees.md): two deliveries of one run each "
    "appended some of its messages; every load keeps one copy, the stream holds two",
}
"""Problems the harness reports without failing: shown as xfail with their runs. Every other
problem (any loss, duplicated final events, a step, call or ending after a run's final event,
double bookings, sessions left claimed, approval runs not completed, a minority's completion
the majority never stored, invalid histories, requests stuck in the queue) fails."""
CHOSEN = [name for name in os.environ.get("RUNBUS_JEPSEN_FAULTS", "").split(",") if name]


async def test_every_node_runs_the_shipped_settings(cluster: Cluster) -> None:
    varz = {name: json.loads((await cluster.monitor(name, "/varz"))[1]) for name in NODES}

    for name, node in varz.items():
        assert node["server_name"] == f"nats-{name[1:]}"
        assert node["jetstream"]["config"]["sync_always"] is True
        assert node["cluster"]["name"] == "runbus"
        assert node["auth_required"] is True
    assert {len(node["cluster"]["urls"]) for node in varz.values()} == {len(NODES)}


# nats-py can leave the socket of a connection to a paused or cut-off node unclosed when it
# reconnects to another one; the garbage collector then reports it at a random later moment.
@pytest.mark.filterwarnings("ignore:unclosed <StreamWriter:ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("fault", CHOSEN or (list(FAULTS) if FULL else SHORT))
async def test_a_healed_fault_loses_repeats_and_double_books_nothing(
    fault: str, cluster: Cluster, cluster_report: ClusterReport
) -> None:
    load = Workload(cluster, prefix=fault, runs=RUNS, in_flight=IN_FLIGHT, approvals=APPROVALS)
    await load.listen()
    try:
        await load.ask_approvals()
        unasked = [run.run_id for run in load.waiting_for_approval if not run.approval_call]
        assert not unasked, [await describe(cluster, run_id) for run_id in unasked]
        loading = asyncio.create_task(load.run(timeout=RECOVER_WITHIN * 2))
        await load.finished_more(WARM_UP, 60)
        in_flight = load.in_flight_now()
        began = time.monotonic()
        applied = await FAULTS[fault](cluster, load, HOLD)
        fault_s = time.monotonic() - began
        await load.approve_all()
        recovery = await recover(cluster, load, RECOVER_WITHIN)
        recover_s = time.monotonic() - applied.healed_at
        await loading
    finally:
        await load.close()

    counts = await check(cluster, load, minority_seen=applied.minority_seen)
    counts.in_flight, counts.fault_s, counts.recover_s = in_flight, fault_s, recover_s
    cluster_report.rows.append(counts.row())
    cluster_report.notes += [f"{fault}: {note}" for note in applied.notes]
    if counts.failures:
        cluster_report.notes.append(f"{fault}: failed runs: {dict(counts.failures)}")
    if recovery.stuck or recovery.claimed:
        cluster_report.notes.append(f"{fault}: after {recover_s:.0f}s: {recovery}")

    assert in_flight > 0, "the fault found no run in flight"
    assert not recovery.queue_left, (
        f"not recovered {RECOVER_WITHIN:.0f}s after the heal: {recovery}"
    )
    problems = counts.problems()
    if recovery.unfinished:
        # Requests that left the queue with no final event: lost, shown with their records.
        problems["lost"] = [*counts.lost, recovery.diagnosis]
    unknown = {name: runs for name, runs in problems.items() if name not in KNOWN}
    assert not unknown, unknown
    assert counts.acknowledged == RUNS + APPROVALS
    if problems:
        pytest.xfail("; ".join(f"{KNOWN[name]}: {runs}" for name, runs in problems.items()))
    assert counts.one_final == counts.acknowledged
