"""The faults, each applied while runs are in flight, held until the cluster has shown what it
does under it (a state: a new leader, runs finishing on the side that can, a client noticing),
then healed: partitions (iptables DROP), pauses (SIGSTOP), a crash (SIGKILL, data kept) and a
rolling restart."""

import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import nats
from nats.aio.msg import Msg

from runbus import subjects
from tests.cluster.harness import CLIENT, CLIENT_OPTIONS, NODES, Cluster
from tests.cluster.workload import EVENT, TERMINAL, Workload
from tests.helpers import eventually


@dataclass
class Applied:
    """What a fault did, for the checker and the report."""

    held_s: float = 0.0
    healed_at: float = 0.0
    notes: list[str] = field(default_factory=list)
    minority_seen: dict[str, list[bytes]] = field(default_factory=dict)
    """Final events a client connected to the minority side heard (run id → raw events)."""


@dataclass(frozen=True)
class Hold:
    runs: int
    """Runs that must finish while the fault is on (where any side can finish them)."""
    at_most: float
    """Seconds a fault is held when that never happens (it is then noted)."""


Fault = Callable[[Cluster, Workload, Hold], Awaitable[Applied]]


async def _hold(load: Workload, hold: Hold, applied: Applied, began: float) -> None:
    if not await load.finished_more(hold.runs, hold.at_most):
        applied.notes.append(f"no {hold.runs} runs finished within {hold.at_most:.0f}s")
    applied.held_s = time.monotonic() - began


async def _new_leader(cluster: Cluster, old: str) -> None:
    """Until a node other than `old` leads the run queue, as one of those nodes sees it."""
    via = next(name for name in NODES if name != old)

    async def moved() -> bool:
        return await cluster.stream_leader(subjects.RUNS_STREAM, via=via) != old

    await eventually(moved, 60, interval=0.5, what=f"the run queue led by another node than {old}")


async def node_cut_off(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """The host of the run queue's leader (its node and its services) loses the network."""
    applied = Applied()
    victim = await cluster.stream_leader(subjects.RUNS_STREAM)
    applied.notes.append(f"cut off {victim} (run queue leader)")
    began = time.monotonic()
    cluster.network.isolate(victim)
    try:
        await _new_leader(cluster, victim)
        await _hold(load, hold, applied, began)
    finally:
        cluster.network.heal()
        applied.healed_at = time.monotonic()
    await cluster.node_healthy(victim)
    return applied


MINORITY: Final = "n3"


async def minority_split(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """n1 and n2 (a quorum) on one side, n3 with a gateway, history, model router and tool
    executor on the other; the clients' host reaches both, and a witness on n3's node hears
    every event published there."""
    applied = Applied()
    majority = [n for n in NODES if n != MINORITY]
    witness = await nats.connect(
        cluster.node_url(MINORITY), **cluster.service_login(), **CLIENT_OPTIONS
    )

    async def heard(msg: Msg) -> None:
        event = EVENT.decode(msg.data)
        if event.type in TERMINAL:
            applied.minority_seen.setdefault(event.run_id, []).append(msg.data)

    await witness.subscribe(subjects.events("*", "*", "*"), cb=heard)
    await witness.flush()
    leader = await cluster.stream_leader(subjects.RUNS_STREAM)
    applied.notes.append(f"{MINORITY} alone (run queue leader was {leader})")
    began = time.monotonic()
    cluster.network.split(majority, [MINORITY])
    try:
        if leader == MINORITY:
            await _new_leader(cluster, leader)
        await _hold(load, hold, applied, began)
    finally:
        cluster.network.heal()
        applied.healed_at = time.monotonic()
        await cluster.node_healthy(MINORITY)
        with contextlib.suppress(Exception):
            await witness.close()
    applied.notes.append(
        f"{sum(map(len, applied.minority_seen.values()))} final events heard on {MINORITY}"
    )
    return applied


async def clients_cut_off(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """The clients' host loses every node: requests in flight get no answer, events no
    listener; the cluster runs on."""
    applied = Applied()
    began = time.monotonic()
    cluster.network.split([CLIENT], NODES)
    try:
        await eventually(
            lambda: cluster.client_nc is not None and not cluster.client_nc.is_connected,
            30,
            what="the client noticing it is cut off",
        )
        applied.held_s = time.monotonic() - began
    finally:
        cluster.network.heal()
        applied.healed_at = time.monotonic()
    await eventually(
        lambda: cluster.client_nc is not None and cluster.client_nc.is_connected,
        60,
        what="the client connected again",
    )
    return applied


async def node_paused(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """SIGSTOP of the run queue leader's node: its sockets stay open, nothing answers."""
    applied = Applied()
    victim = await cluster.stream_leader(subjects.RUNS_STREAM)
    applied.notes.append(f"paused nats@{victim} (run queue leader)")
    node = cluster.nodes[victim]
    began = time.monotonic()
    node.signal(signal.SIGSTOP)
    try:
        await _new_leader(cluster, victim)
        await _hold(load, hold, applied, began)
    finally:
        node.signal(signal.SIGCONT)
        applied.healed_at = time.monotonic()
    await cluster.node_healthy(victim)
    return applied


async def gateway_paused(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """SIGSTOP of one gateway with runs in hand: the other takes them over once they go
    unconfirmed; the paused one wakes up to find them gone."""
    applied = Applied()
    gateway = cluster.services["gateway@n1"]
    began = time.monotonic()
    gateway.signal(signal.SIGSTOP)
    try:
        await _hold(load, hold, applied, began)
    finally:
        gateway.signal(signal.SIGCONT)
        applied.healed_at = time.monotonic()
    return applied


async def node_killed(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """SIGKILL of the run queue leader's node, then the same node started again on the data
    directory it left."""
    applied = Applied()
    victim = await cluster.stream_leader(subjects.RUNS_STREAM)
    applied.notes.append(f"killed nats@{victim} (run queue leader)")
    began = time.monotonic()
    await cluster.nodes[victim].kill()
    try:
        await _new_leader(cluster, victim)
        await _hold(load, hold, applied, began)
    finally:
        await cluster.restart_node(victim)
        applied.healed_at = time.monotonic()
    return applied


async def rolling_restart(cluster: Cluster, load: Workload, hold: Hold) -> Applied:
    """Every node in turn stopped (SIGTERM: lame duck, then exit) and started again, the
    next one only once the last is healthy, as an operator upgrading the cluster would."""
    applied = Applied()
    began = time.monotonic()
    for name in NODES:
        await cluster.nodes[name].stop(timeout=30)
        await cluster.restart_node(name)
    applied.held_s = time.monotonic() - began
    applied.healed_at = time.monotonic()
    return applied


FAULTS: Final[dict[str, Fault]] = {
    "node-cut-off": node_cut_off,
    "minority-split": minority_split,
    "clients-cut-off": clients_cut_off,
    "node-paused": node_paused,
    "gateway-paused": gateway_paused,
    "node-killed": node_killed,
    "rolling-restart": rolling_restart,
}
