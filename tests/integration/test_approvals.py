"""Human in the loop and terminate, through the whole stack: a run waits for a person,
survives a restart of every service, books once; a policy stop leaves no orphan call."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import (
    HistoryLoad,
    ModelRequest,
    RunCompleted,
    RunFailed,
)
from runbus.messages.runs import ApprovalDecide, RunGet
from runbus_examples import AGENTS_DIR
from runbus_examples.travel import ledger
from runbus_gateway.agents import load_agents
from runbus_gateway.run.late import RESUME_WITHIN
from tests.helpers import approval_requested
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}
GATEWAY = {"ack_wait": 1.0, "stop_grace": 0.2}


def book(cabin: str, flight_id: str = "QF412-20261208"):  # type: ignore[no-untyped-def]
    def reply(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        if step == 0:
            return call("create_booking", "c-book", flight_id=flight_id, cabin=cabin)
        result = [r for m in request.messages for r in m.function_results][-1]
        return text(f"Outcome: {result.error or result.result}")

    return reply


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


async def _final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


async def test_approval_pauses_the_run_across_a_restart_of_every_service_and_books_once(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(book("business"))
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "a",
        agents=AGENTS,
        routes={"gated": model},
        gateway_options=GATEWAY,
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="appr")
        asked = await approval_requested(alice, run_id)
    # Every service is gone; the run request was never acked, the approval is pending in KV.
    assert ledger.count(run_id) == 0
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "b",
        agents=AGENTS,
        routes={"gated": model},
        gateway_options=GATEWAY,
    ):
        decided = await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved"),
        )
        final = await _final(alice, run_id)
        with pytest.raises(RemoteError) as again:
            await alice.call(
                ops.API_APPROVALS_DECIDE,
                ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="denied"),
            )

    assert asked.tool == "create_booking"
    assert "A$" in asked.reason
    assert decided.decision == "approved"
    assert isinstance(final, RunCompleted)
    assert "approved_by" in final.text
    assert ledger.count(run_id) == 1
    assert again.value.remote_code == "conflict"


async def test_an_approval_that_uses_up_the_runs_deadline_books_once_in_a_new_delivery(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    """With a run timeout under `RESUME_WITHIN`, every approval comes too late for the
    delivery that asked: the run is delivered again, with a deadline of its own, finds the
    decision and books once (the model is not asked for the call again)."""
    model = GatedModel(book("business"))
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={**GATEWAY, "run_timeout": RESUME_WITHIN / 2},
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="late")
        asked = await approval_requested(alice, run_id)
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved"),
        )
        final = await _final(alice, run_id)
        record = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record

    assert isinstance(final, RunCompleted)
    assert "approved_by" in final.text
    assert record.attempts == 2
    assert ledger.count(run_id) == 1
    assert len(model.requests) == 2  # the booking call was not asked for again


def book_as_asked(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    """Business (which needs a person's approval) when the question says so, else a cheap
    economy fare (which does not)."""
    asked = next(m.text for m in request.messages if m.role == "user")
    if "business" in asked:
        return book("business")(request, step)
    return book("economy", "QF431-20260310")(request, step)


async def test_runs_waiting_for_a_person_leave_the_replicas_run_slots_to_other_runs(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(book_as_asked)
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={**GATEWAY, "run_concurrency": 1},
    ):
        # Two runs wait for a person on a replica that runs one run at a time ...
        waiting = [
            await alice.start("travel", "Book QF412 in business", session_id=f"park-{n}")
            for n in range(2)
        ]
        asked = [await approval_requested(alice, run_id) for run_id in waiting]
        # ... and a third, needing nobody, still runs to its end meanwhile.
        quick = await alice.start("travel", "Book QF431 in economy", session_id="park-quick")
        quick_final = await _final(alice, quick)
        for run_id, request in zip(waiting, asked, strict=True):
            await alice.call(
                ops.API_APPROVALS_DECIDE,
                ApprovalDecide(run_id=run_id, call_id=request.call_id, decision="approved"),
            )
        finals = [await _final(alice, run_id) for run_id in waiting]

    assert isinstance(quick_final, RunCompleted)
    assert all(isinstance(f, RunCompleted) for f in finals), finals
    assert [ledger.count(r) for r in [*waiting, quick]] == [1, 1, 1]


async def test_a_denied_call_is_a_result_the_model_reads_and_nothing_is_booked(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, bob_client: RunbusClient
) -> None:
    model = GatedModel(book("business"))
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options=GATEWAY,
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="deny")
        asked = await approval_requested(alice, run_id)
        with pytest.raises(RemoteError) as foreign:
            await bob_client.call(
                ops.API_APPROVALS_DECIDE,
                ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved"),
            )
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(
                run_id=run_id, call_id=asked.call_id, decision="denied", note="too expensive"
            ),
        )
        final = await _final(alice, run_id)

    assert foreign.value.remote_code == "not_found"
    assert isinstance(final, RunCompleted)
    assert "denied" in final.text
    assert ledger.count(run_id) == 0


@pytest.fixture
async def bob_client(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-bob")
    await nc.drain()


async def test_policy_terminate_stops_the_loop_and_answers_every_call_of_the_batch(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    def two_bookings(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        assert step == 0, "no model call may follow a terminate"
        message = call("create_booking", "c-ok", flight_id="QF412-20261208")
        blocked = call("create_booking", "c-blocked", flight_id="VA823-20261208")
        return msgspec.structs.replace(message, contents=message.contents + blocked.contents)

    model = GatedModel(two_bookings)
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options=GATEWAY,
    ):
        done = await alice.run("travel", "Book both", session_id="term")
        loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="term"))
        model.replies = lambda request, step: text("Next run works.")
        after = await alice.run("travel", "Anything else?", session_id="term")

    assert len(model.requests) == 2  # the terminated run's only call, then the next run's
    assert "VA823" in done.text
    [tool_message] = [m for m in loaded.messages if m.role == "tool"]
    assert {r.call_id for r in tool_message.function_results} == {"c-ok", "c-blocked"}
    assert after.text == "Next run works."
    await asyncio.sleep(0)
