"""What `runs.get` says while a run waits: `queued` behind its tenant's concurrent-run limit
(held across gateway replicas, without blocking other tenants), `waiting_approval` while a
person decides, and the final status after."""

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError, Unavailable
from runbus.messages import ModelRequest, RunCompleted, RunFailed
from runbus.messages.runs import (
    ApprovalDecide,
    RunCancel,
    RunGet,
    RunList,
    RunStatus,
)
from runbus.tokens import TokenVerifier
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.service import GatewayService
from runbus_gateway.tenants import TenantLimits
from tests.helpers import approval_requested, eventually
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


async def _client(url: str, token: str) -> RunbusClient:
    return RunbusClient(await nats.connect(url), token=token)


@pytest.fixture
async def clients(nats_server: SecuredNats) -> AsyncIterator[tuple[RunbusClient, RunbusClient]]:
    alice = await _client(nats_server.url, "dev-alice")  # tenant acme
    carol = await _client(nats_server.url, "dev-carol")  # tenant globex
    yield alice, carol
    for client in (alice, carol):
        await client.nc.drain()


async def _statuses(client: RunbusClient) -> dict[str, RunStatus]:
    listed = await client.call(ops.API_RUNS_LIST, RunList(limit=100))
    return {r.run_id: r.status for r in listed.records}


async def _status(client: RunbusClient, run_id: str) -> RunStatus:
    info = await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
    return info.record.status


async def test_a_tenant_runs_no_more_than_its_limit_across_replicas_and_others_go_on(
    nats_server: SecuredNats, tmp_path: Path, clients: tuple[RunbusClient, RunbusClient]
) -> None:
    alice, carol = clients
    limits = TenantLimits(default=2)
    model = GatedModel(lambda request, step: text("ok"), hold={0})
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={"tenant_limits": limits},
    ) as stack:
        await stack.start_service(
            GatewayService,
            agents=AGENTS,
            verifier=TokenVerifier.from_file(),
            tenant_limits=limits,
        )
        acme = [await alice.start("travel", "Hi", session_id=f"a{n}") for n in range(6)]
        globex = [await carol.start("travel", "Hi", session_id=f"g{n}") for n in range(2)]

        async def every_run_admitted_or_refused() -> bool:
            """Each run is either at the model or was refused a tenant slot (`queued`): the
            limit was applied to all eight, whether it held or leaked."""
            statuses = [*(await _statuses(alice)).values(), *(await _statuses(carol)).values()]
            return len(statuses) == 8 and model.in_flight + statuses.count("queued") == 8

        await eventually(every_run_admitted_or_refused)
        held = model.in_flight
        acme_held = await _statuses(alice)
        globex_held = await _statuses(carol)
        cancelled = next(r for r in acme if acme_held[r] == "queued")
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=cancelled))
        cancel_final = [i.event async for i in alice.follow(cancelled, timeout=5)][-1]
        model.release.set()
        for client, run_ids in ((alice, acme), (carol, globex)):
            for run_id in run_ids:
                if run_id != cancelled:
                    events = [i.event async for i in client.follow(run_id, timeout=20)]
                    assert isinstance(events[-1], RunCompleted), events[-1]
        acme_done = await _statuses(alice)

    assert held == 4  # two of acme's six, both of globex's two
    assert model.max_in_flight == 4
    assert sorted(acme_held.values()) == ["queued"] * 4 + ["running"] * 2
    assert sorted(globex_held.values()) == ["running"] * 2
    assert isinstance(cancel_final, RunFailed)
    assert cancel_final.error.code == "cancelled"
    assert acme_done == {**dict.fromkeys(acme, "completed"), cancelled: "cancelled"}


async def test_a_run_waiting_for_a_person_can_be_cancelled(
    nats_server: SecuredNats, tmp_path: Path, clients: tuple[RunbusClient, RunbusClient]
) -> None:
    alice, _ = clients
    model = GatedModel(_book_business)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="wait")
        await approval_requested(alice, run_id)
        await eventually(lambda: _is(alice, run_id, "waiting_approval"))
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        final = [i.event async for i in alice.follow(run_id, timeout=5)][-1]
        after = await _status(alice, run_id)

    assert isinstance(final, RunFailed)
    assert final.error.code == "cancelled"
    assert after == "cancelled"


def _book_business(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    if step == 0:
        return call("create_booking", "c-book", flight_id="QF412-20261208", cabin="business")
    return text("done")


async def test_a_run_waiting_for_a_person_says_so_until_the_decision(
    nats_server: SecuredNats, tmp_path: Path, clients: tuple[RunbusClient, RunbusClient]
) -> None:
    alice, _ = clients
    model = GatedModel(_book_business)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="wait")
        asked = await approval_requested(alice, run_id)
        seen: list[RunStatus] = []

        async def waiting_seen() -> bool:
            seen.append(await _status(alice, run_id))
            return seen[-1] == "waiting_approval"

        await eventually(waiting_seen)
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved"),
        )
        final = [i.event async for i in alice.follow(run_id, timeout=20)][-1]
        after = await _status(alice, run_id)

    assert set(seen) <= {"running", "waiting_approval"}
    assert isinstance(final, RunCompleted)
    assert after == "completed"


def _always_down(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    # `unavailable`: the one failure a run is retried for (a bug, `internal`, is not).
    raise Unavailable("the model router has no replica for this route")


async def test_a_run_queued_for_a_retry_can_be_cancelled_before_its_next_attempt(
    nats_server: SecuredNats, tmp_path: Path, clients: tuple[RunbusClient, RunbusClient]
) -> None:
    alice, _ = clients
    model = GatedModel(_always_down)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        run_id = await alice.start("travel", "Hi", session_id="retry")
        await eventually(lambda: _waits_for_retry(alice, run_id), retrying=(RemoteError,))
        info = await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        calls = len(model.requests)
        final = [i.event async for i in alice.follow(run_id, timeout=10)][-1]
        after = await _status(alice, run_id)

    assert info.record.status == "cancelled"
    assert isinstance(final, RunFailed)
    assert final.error.code == "cancelled"
    assert after == "cancelled"
    assert len(model.requests) == calls  # no attempt after the cancel


async def _waits_for_retry(client: RunbusClient, run_id: str) -> bool:
    """Queued again after a failed attempt (before its first one it is queued too)."""
    info = await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
    return info.record.status == "queued" and info.record.attempts >= 1


async def _is(client: RunbusClient, run_id: str, status: RunStatus) -> bool:
    return await _status(client, run_id) == status
