"""Beyond one machine: a 3-node NATS cluster on loopback with every runbus stream and KV bucket
at 3 replicas, and on every node the accounts and auth callout of a single secured server. The
services connect with the service credential, clients with their tokens. Stopping any one node
while 50 runs are in flight loses none of them; no node lets a client past its own subjects."""

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from runbus import busauth, subjects
from runbus.client import open_connection
from runbus.jetstream import open_bucket
from runbus.runner import connect
from runbus.tokens import token_digest
from tests.helpers import eventually, raw_request, refused_raw
from tests.stack import SecuredCluster, Stack, secured_cluster, start_stack

RUNS: Final = 50
IN_FLIGHT: Final = 8
STOP_AFTER: Final = 15
"""The node goes down once this many runs have completed, with the next ones in flight."""
FINISH_WITHIN: Final = 60.0
"""Seconds every run has after the stop: elections, a lost request's timeout, a retry."""
STOP_WITHIN: Final = 45.0
"""Seconds the six services may take to drain and stop after the test."""
# What a service process uses (runbus.runner.connect): reconnect forever, quickly.
RECONNECT: Final[dict[str, Any]] = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.5}

pytestmark = pytest.mark.slow  # three-node clusters, elections and node stops


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[SecuredCluster]:
    """The cluster, secured; its auth service follows the cluster when its node stops."""
    async with secured_cluster(tmp_path / "cluster", tmp_path / "bus", **RECONNECT) as running:
        yield running


@pytest.fixture
async def clustered_stack(bus: SecuredCluster, tmp_path: Path) -> AsyncIterator[Stack]:
    running = start_stack(
        bus.client_urls,
        data_dir=tmp_path / "data",
        stream_replicas=3,
        # A request lost with a node is retried by the run, not waited on for 30 s.
        request_timeout=5.0,
        connect_options={**RECONNECT, **bus.service_login},
    )
    stack = await running.__aenter__()
    try:
        yield stack
    finally:
        # A stop that never ends must fail this test, not hang the suite: pytest-timeout's
        # exception can land inside an asyncio task and be swallowed there.
        try:
            async with asyncio.timeout(STOP_WITHIN):
                await running.__aexit__(None, None, None)
        except TimeoutError:
            current = asyncio.current_task()
            stuck = sorted(
                str(task.get_coro()) for task in asyncio.all_tasks() if task is not current
            )
            pytest.fail(f"the stack did not stop within {STOP_WITHIN:.0f}s; waiting: {stuck}")


async def publish_run(js: JetStreamContext, run_id: str) -> None:
    """Publish until JetStream acknowledges; a repeat is dropped by `Nats-Msg-Id`."""
    body = raw_request(run_id, f"Weather in Hobart? ({run_id})", session_id=f"s-{run_id}")
    headers = {"Nats-Msg-Id": run_id, "rb-auth": "Bearer dev-alice"}
    await eventually(
        lambda: js.publish(subjects.runs("travel"), body, headers=headers, timeout=2),
        30,
        retrying=(nats.errors.TimeoutError, nats.errors.NoRespondersError),
        what=f"JetStream's acknowledgement of {run_id}",
    )


async def final_event(js: JetStreamContext, run_id: str, timeout: float = 60.0) -> str:
    """The type of the run's terminal event, read back from the events stream."""

    async def final() -> str:
        last = await js.get_last_msg(
            subjects.EVENTS_STREAM, subjects.events("acme", "alice", run_id)
        )
        kind: str = json.loads(last.data or b"{}").get("type", "")
        return kind if kind in ("run.completed", "run.failed") else ""

    try:  # no event yet, or the stream is electing a leader: not yet
        return await eventually(
            final,
            timeout,
            retrying=(nats.errors.Error, nats.js.errors.Error, TimeoutError),
            interval=0.1,
        )
    except AssertionError:
        return "none"


async def event_counts(nc: NATS) -> dict[str, Counter[str]]:
    """Every event in the events stream, counted by type per run."""
    counts: dict[str, Counter[str]] = {}
    subscription = await nc.jetstream().subscribe(
        subjects.EVENTS_ALL, stream=subjects.EVENTS_STREAM, ordered_consumer=True
    )
    try:
        while True:
            try:
                msg = await subscription.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                return counts
            run_id = msg.subject.rsplit(".", 1)[-1]
            counts.setdefault(run_id, Counter())[json.loads(msg.data)["type"]] += 1
    finally:
        await subscription.unsubscribe()


async def stream_replicas(nc: NATS) -> dict[str, int]:
    return {
        str(info.config.name): info.config.num_replicas or 1
        for info in await nc.jetstream().streams_info()
    }


@pytest.mark.parametrize("role", ["leader", "follower"])
async def test_stopping_one_node_of_three_during_50_runs_loses_no_run(
    bus: SecuredCluster, clustered_stack: Stack, role: str
) -> None:
    cluster = bus.cluster
    # Alice sends the runs with her token (through the callout of whichever node she is on,
    # again after a reconnect); the test reads them back as an operator, with the service
    # credential (the events stream and the queue are not a client's to read).
    client = await open_connection(bus.client_urls, "dev-alice", **RECONNECT)
    nc = await nats.connect(bus.client_urls, **RECONNECT, **bus.service_login)
    try:
        js = nc.jetstream()
        sending = client.jetstream()
        replicas = await stream_replicas(nc)
        assert replicas, "the services created no stream"
        assert set(replicas.values()) == {3}, replicas
        queue_cluster = (await js.stream_info(subjects.RUNS_STREAM)).cluster
        assert queue_cluster is not None
        names = [node.name for node in cluster.nodes]
        lead = names.index(str(queue_cluster.leader))
        # The run queue's leader (its loss forces an election), or a node that only follows.
        victim = lead if role == "leader" else (lead + 1) % len(names)

        completed = 0
        enough = asyncio.Event()
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one(index: int) -> tuple[str, str]:
            nonlocal completed
            run_id = f"r-cluster-{index}"
            async with slots:
                await publish_run(sending, run_id)
                outcome = await final_event(js, run_id)
            completed += 1
            if completed >= STOP_AFTER:
                enough.set()
            return run_id, outcome

        runs = [asyncio.create_task(one(index)) for index in range(RUNS)]
        await enough.wait()
        in_flight = sum(not run.done() for run in runs)
        cluster.stop_node(victim)
        _, pending = await asyncio.wait(runs, timeout=FINISH_WITHIN)
        for run in pending:
            run.cancel()

        assert in_flight > 0
        assert not pending, f"{len(pending)} runs unfinished {FINISH_WITHIN:.0f}s after the stop"
        outcomes = dict(run.result() for run in runs)
        assert Counter(outcomes.values()) == {"run.completed": RUNS}
        counts = await event_counts(nc)
        assert sorted(counts) == sorted(outcomes)
        assert {run_id: c["run.completed"] for run_id, c in counts.items()} == dict.fromkeys(
            outcomes, 1
        )

        # Every request is acked, none left behind. A run's request is acked just after its
        # final event is stored, so the last few may still be settling here.
        async def drained() -> bool:
            return (await js.stream_info(subjects.RUNS_STREAM)).state.messages == 0

        await eventually(
            drained, 30, retrying=(nats.errors.Error, nats.js.errors.Error), what="queue drained"
        )
    finally:
        await client.close()
        await nc.close()


async def test_a_service_connects_with_a_url_listing_every_node(bus: SecuredCluster) -> None:
    # As compose.cluster.yaml sets it: nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222
    # and the service's own credential beside it (RUNBUS_NATS_USER, RUNBUS_NATS_PASSWORD_FILE).
    bus.cluster.stop_node(0)

    nc = await connect(",".join(bus.client_urls), "runbus-test", credentials=bus.service)
    try:
        assert nc.connected_url is not None
        assert nc.connected_url.port != bus.cluster.nodes[0].port
        # Connected as the service: an internal subject is its to use (a client's is refused).
        internal = await nc.subscribe(subjects.HISTORY_LOAD)
        await nc.publish(subjects.HISTORY_LOAD, b"{}")
        assert (await internal.next_msg(timeout=5)).data == b"{}"
    finally:
        await nc.close()


async def test_a_bucket_made_with_one_replica_gets_three_when_the_deployment_asks(
    bus: SecuredCluster,
) -> None:
    nc = await connect(",".join(bus.client_urls), "bucket-test", credentials=bus.service)
    try:
        await open_bucket(nc, "runbus_replicas_test", replicas=1)
        await open_bucket(nc, "runbus_replicas_test", replicas=3)
        again = await open_bucket(nc, "runbus_replicas_test", replicas=1)  # never lowered
        await again.put("k", b"v")
        info = await nc.jetstream().stream_info("KV_runbus_replicas_test")
    finally:
        await nc.drain()

    assert info.config.num_replicas == 3


# What a client may not do, on every node


class Watched:
    """A connection's errors as the server reported them (permission violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    async def on_error(self, error: Exception) -> None:
        self.errors.append(str(error).lower())

    def refused(self, what: str) -> bool:
        return any(f"permissions violation for {what.lower()}" in e for e in self.errors)


ATTACKS: Final = ("_INBOX.>", subjects.EVENTS_ALL, subjects.events("acme", "alice", "*"))
"""What Carol (tenant globex, a valid token) subscribes to, hoping for Alice's (tenant acme)
messages: every inbox, every event, Alice's events."""


async def attack_from(node: str, service: NATS, index: int) -> None:
    """Carol on `node` tries every attack; the server refuses each, and Alice's messages
    never reach her while her own do."""
    watched = Watched()
    carol = await open_connection(node, "dev-carol", error_cb=watched.on_error)
    try:
        assert carol.connected_url is not None
        assert f"{carol.connected_url.hostname}:{carol.connected_url.port}" in node
        # Her own inbox: a client reads its events through a consumer delivering there.
        own_subject = f"{subjects.client_inbox_prefix(token_digest('dev-carol'))}.own-{index}"
        own = await carol.subscribe(own_subject)
        stolen = [await carol.subscribe(subject) for subject in ATTACKS]
        # A request to an internal service: any session's history, for example.
        await carol.publish(
            subjects.HISTORY_LOAD, b'{"type":"history.load"}', reply=carol.new_inbox()
        )
        await carol.flush()
        await eventually(
            lambda: (
                all(watched.refused(f'subscription to "{subject}"') for subject in ATTACKS)
                and watched.refused(f'publish to "{subjects.HISTORY_LOAD}"')
            ),
            what=f"every attack refused on {node}",
        )

        # What Alice's connection would receive, then Carol's own message: one publisher and
        # one account, so Carol's event arrives after the others would have. Again until it
        # does: her interest reaches the publisher's node over a route, a little later.
        alice_inbox = f"{subjects.client_inbox_prefix(token_digest('dev-alice'))}.reply"

        async def carol_hears_her_own() -> bool:
            await service.publish(subjects.events("acme", "alice", "r-1"), b"alice")
            await service.publish(alice_inbox, b"alice's reply")
            await service.publish(own_subject, b"carol")
            try:
                return (await own.next_msg(timeout=0.5)).data == b"carol"
            except nats.errors.TimeoutError:
                return False

        await eventually(carol_hears_her_own, what=f"carol's own event on {node}")
        assert [sub.pending_msgs for sub in stolen] == [0] * len(stolen)
    finally:
        await carol.close()


async def test_another_users_token_gets_no_one_elses_events_inbox_or_services_on_any_node(
    bus: SecuredCluster,
) -> None:
    service = await nats.connect(bus.client_urls, **bus.service_login)
    internal: list[Msg] = []

    async def on_internal(msg: Msg) -> None:
        internal.append(msg)

    await service.subscribe(subjects.HISTORY_LOAD, cb=on_internal)
    await service.flush()
    try:
        for index, node in enumerate(bus.client_urls):
            await attack_from(node, service, index)
        await service.flush()
        assert internal == []
    finally:
        await service.close()


async def test_a_connection_without_a_good_credential_is_refused_on_every_node(
    bus: SecuredCluster,
) -> None:
    for url in bus.client_urls:
        assert "Authorization Violation" in await refused_raw(url)
        assert "Authorization Violation" in await refused_raw(url, token="dev-mallory")
        guess = {"user": busauth.SERVICE_USER, "password": "guess"}
        assert "Authorization Violation" in await refused_raw(url, **guess)
