"""Runs survive a dying gateway, late clients replay every event, poison runs end in the dead
letters, and a replica never runs more than its limit."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from opentelemetry.sdk.trace import TracerProvider

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.messages import (
    ChatMessage,
    HistoryLoad,
    ModelRequest,
    RunCompleted,
    RunFailed,
    RunTextDelta,
)
from runbus.messages.runs import RunGet, RunList
from runbus.settings import load_settings
from runbus.tokens import TokenVerifier
from runbus_examples import AGENTS_DIR, travel
from runbus_gateway.agents import load_agents
from runbus_gateway.service import GatewayService
from runbus_tool_executor.service import ToolExecutorService
from tests.helpers import eventually
from tests.models import GatedModel, call, text, turn_step, weather_then_answer
from tests.stack import SecuredNats, Stack, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


def _invocations(stack: Stack, tool: str) -> int:
    service = stack.services["tool_executor"]
    assert isinstance(service, ToolExecutorService)
    assert service._micro is not None
    return sum(e.num_requests for e in service._micro.stats().endpoints if e.name.endswith(tool))


@pytest.mark.slow
async def test_run_of_a_dead_gateway_resumes_elsewhere_without_repeating_finished_steps(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer, hold={1})
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={"ack_wait": 1.5},
    ) as stack:
        run_id = await alice.start("travel", "Weather?", session_id="crash")
        await asyncio.wait_for(model.reached.wait(), 10)  # step 0 and its tool call are done
        doomed = stack.services["gateway"]
        await stack.start_service(
            GatewayService, agents=AGENTS, verifier=TokenVerifier.from_file(), ack_wait=1.5
        )
        model.hold.clear()
        await doomed.nc.close()  # the replica vanishes mid-run: no ack, no cleanup reaches NATS
        model.release.set()

        finals = [
            i.event
            async for i in alice.follow(run_id, timeout=20)
            if isinstance(i.event, RunCompleted | RunFailed)
        ]
        loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="crash"))
        steps = [turn_step(r) for r in model.requests]
        weather_calls = _invocations(stack, "get_weather")

    assert len(finals) == 1
    assert isinstance(finals[0], RunCompleted)
    assert steps.count(0) == 1  # the finished model step was not repeated
    # Its call was stored before it ran, its result not yet (a step's results travel with the
    # next step's reply): the resumed run calls it again under the same call id, which the
    # executor answers from its record for a side-effecting tool; this one only reads.
    assert weather_calls == 2
    ids = [m.message_id for m in loaded.messages]
    assert ids == [f"{run_id}:{part}" for part in ("in0", "m0", "t0", "m1")]


async def test_run_ack_wait_from_the_environment_sets_how_soon_a_dead_gateways_run_resumes(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    """The first gateway makes the run consumer with the default ack wait (30 s) and takes a
    run; a replica started meanwhile with `RUNBUS_RUN_ACK_WAIT=3` brings the consumer to 3 s,
    so that run, its gateway killed, resumes within seconds rather than half a minute."""
    agents_dir = tmp_path / "agents"
    agents_dir.mkdir()
    travel_toml = (AGENTS_DIR / "travel.toml").read_text()
    (agents_dir / "travel.toml").write_text(travel_toml.replace('"offline"', '"gated"'))
    model = GatedModel(weather_then_answer, hold={1})
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ) as stack:
        run_id = await alice.start("travel", "Weather?", session_id="quick")
        await asyncio.wait_for(model.reached.wait(), 10)  # the only gateway runs it
        settings = load_settings({"RUNBUS_RUN_ACK_WAIT": "3", "RUNBUS_AGENTS_DIR": str(agents_dir)})
        nc = await nats.connect(nats_server.url)
        second = GatewayService.from_settings(nc, settings, TracerProvider())
        await second.start()
        try:
            info = await nc.jetstream().consumer_info(subjects.RUNS_STREAM, subjects.RUNS_CONSUMER)
            assert info.config.ack_wait == 3
            first = stack.services["gateway"]
            model.hold.clear()
            await first.nc.close()  # the replica running it vanishes: no ack, no cleanup
            model.release.set()

            finals = [
                i.event
                async for i in alice.follow(run_id, timeout=15)
                if isinstance(i.event, RunCompleted | RunFailed)
            ]
        finally:
            await second.stop()
            await nc.drain()

    assert [type(f) for f in finals] == [RunCompleted]


def book_then_answer(request: ModelRequest, step: int) -> ChatMessage:
    """Step 0 books a cheap flight (no approval needed), step 1 answers from the result."""
    if step == 0:
        return call("create_booking", "c-book", flight_id="QF431-20260310")
    results = [r for m in request.messages for r in m.function_results]
    return text(f"Booked: {results[-1].result if results else 'no result'}")


@pytest.mark.slow
async def test_a_booking_whose_result_was_not_stored_yet_is_replayed_not_made_twice(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(book_then_answer, hold={1})
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={"ack_wait": 1.5},
    ) as stack:
        run_id = await alice.start("travel", "Book QF431.", session_id="booked")
        await asyncio.wait_for(model.reached.wait(), 10)  # booked; the result is not stored
        doomed = stack.services["gateway"]
        await stack.start_service(
            GatewayService, agents=AGENTS, verifier=TokenVerifier.from_file(), ack_wait=1.5
        )
        model.hold.clear()
        await doomed.nc.close()
        model.release.set()
        finals = [
            i.event
            async for i in alice.follow(run_id, timeout=20)
            if isinstance(i.event, RunCompleted | RunFailed)
        ]
        booking_calls = _invocations(stack, "create_booking")

    assert len(finals) == 1
    assert isinstance(finals[0], RunCompleted)
    assert booking_calls == 2  # asked again under the same call id after the resume ...
    assert travel.ledger.count(run_id) == 1  # ... and answered from the record, not re-booked
    assert "RB-" in finals[0].text


async def test_a_late_client_replays_every_event_in_order_and_can_resume_after_any(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        live = [e async for e in alice.stream("travel", "Weather?", session_id="late")]
        run_id = live[0].run_id
        replayed = [i async for i in alice.follow(run_id)]
        resumed = [i async for i in alice.follow(run_id, after=replayed[2].seq)]

    assert [i.event for i in replayed] == live
    assert [i.seq for i in replayed] == sorted({i.seq for i in replayed})
    assert [i.event for i in resumed] == live[3:]
    assert any(isinstance(e, RunTextDelta) for e in live)


@pytest.mark.slow
async def test_a_poison_run_ends_in_the_dead_letters_and_does_not_block_others(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    def explode_on_poison(request: ModelRequest, step: int) -> object:
        if "poison" in request.messages[-1].text:
            raise RuntimeError("this request always breaks the model")
        return weather_then_answer(request, step)

    model = GatedModel(explode_on_poison)  # type: ignore[arg-type]
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ) as stack:
        poison = await alice.start("travel", "poison", session_id="p1")
        healthy = await alice.run("travel", "Weather?", session_id="p2")
        finals = [
            i.event
            async for i in alice.follow(poison, timeout=30)
            if isinstance(i.event, RunCompleted | RunFailed)
        ]
        record = await alice.call(ops.API_RUNS_GET, RunGet(run_id=poison))
        dead = (
            await stack.services["gateway"]
            .nc.jetstream()
            .get_last_msg(subjects.DEAD_STREAM, subjects.dead("travel"))
        )

    assert healthy.text.startswith("Done:")
    assert len(finals) == 1
    assert isinstance(finals[0], RunFailed)
    assert finals[0].error.code == "internal"
    assert record.record.status == "failed"
    assert record.record.attempts == 1  # a bug: another attempt would repeat it
    assert dead.headers is not None
    assert dead.headers["rb-error"] == "internal"
    assert "rb-auth" not in dead.headers
    assert b'"run_id":"' + poison.encode() in (dead.data or b"")


async def test_a_replica_never_runs_more_than_its_limit(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(lambda request, step: text("ok"), hold={0})
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={"run_concurrency": 8},
    ):
        run_ids = [await alice.start("travel", "Hi", session_id=f"c{n}") for n in range(30)]
        await eventually(lambda: model.in_flight == 8)
        # The replica pulls one run per free slot: with all eight held it has taken exactly
        # eight requests off the queue, and a leaking limit would already have pulled more.
        queue = await alice.nc.jetstream().consumer_info(
            subjects.RUNS_STREAM, subjects.RUNS_CONSUMER
        )
        held = model.in_flight
        model.release.set()
        finals = [[i.event async for i in alice.follow(r, timeout=20)][-1] for r in run_ids]
        listed = await alice.call(ops.API_RUNS_LIST, RunList(limit=100))

    assert held == 8
    assert (queue.num_ack_pending, queue.num_pending) == (8, 22)
    assert model.max_in_flight == 8
    assert all(isinstance(f, RunCompleted) for f in finals)
    assert {r.run_id for r in listed.records} == set(run_ids)
    assert {r.status for r in listed.records} == {"completed"}
