"""A run acknowledged to its owner always ends in one stored final event: a failure whose
`run.failed` could not be stored is delivered again and ended then, not lost; and a run failed
for good lets go of the session an earlier, cut-off attempt claimed."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.errors import Unavailable
from runbus.headers import MSG_ID, RunContext
from runbus.messages import (
    ChatMessage,
    ErrorInfo,
    ModelRequest,
    RunCompleted,
    RunEvent,
    RunFailed,
    encode,
)
from runbus.messages.runs import RunGet
from runbus.owners import Owner
from runbus.tokens import TokenVerifier
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.queue import RunQueue
from runbus_gateway.run.events import FINAL
from runbus_gateway.service import GatewayService
from tests.helpers import eventually
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, Stack, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


def _queue(stack: Stack) -> RunQueue:
    gateway = stack.services["gateway"]
    assert isinstance(gateway, GatewayService)
    assert gateway._consumer is not None
    queue = gateway._consumer.handler.__self__  # type: ignore[attr-defined]
    assert isinstance(queue, RunQueue)
    return queue


async def _finals(alice: RunbusClient, run_id: str) -> list[RunEvent]:
    return [
        i.event
        async for i in alice.follow(run_id, timeout=30)
        if isinstance(i.event, RunCompleted | RunFailed)
    ]


async def test_a_failure_whose_final_event_was_not_stored_is_ended_again_not_lost(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(request: ModelRequest, step: int) -> object:
        raise RuntimeError("this request always breaks the model")

    model = GatedModel(explode)  # type: ignore[arg-type]
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ) as stack:
        ports = _queue(stack).ports
        emit = ports.emit
        refused: list[RunEvent] = []

        async def emit_failing_once(ctx: RunContext, event: RunEvent, *, event_id: str) -> None:
            if isinstance(event, RunFailed) and not refused:
                refused.append(event)  # as when JetStream has no leader
                raise Unavailable("the events stream has no leader")
            await emit(ctx, event, event_id=event_id)

        monkeypatch.setattr(ports, "emit", emit_failing_once)
        run_id = await alice.start("travel", "poison", session_id="lost")
        finals = await _finals(alice, run_id)
        record = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        gateway = stack.services["gateway"]
        assert isinstance(gateway, GatewayService)
        assert gateway._consumer is not None
        consumer = await gateway._consumer.consumer_info()
        dead = await gateway.nc.jetstream().get_last_msg(
            subjects.DEAD_STREAM, subjects.dead("travel")
        )

    assert len(refused) == 1
    assert len(finals) == 1
    assert isinstance(finals[0], RunFailed)
    assert finals[0].error.code == "internal"
    assert record.record.status == "failed"
    assert len(model.requests) == 1  # ended again, never run again
    assert consumer.config.max_deliver == -1  # the server never drops a run request
    assert b'"run_id":"' + run_id.encode() in (dead.data or b"")


@pytest.mark.slow
async def test_a_run_failed_for_good_releases_the_session_a_cut_off_attempt_claimed(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One attempt only: the next delivery finds every attempt spent, and fails the run for
    # good before it opens the session.
    model = GatedModel(weather_then_answer, hold={0})
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={"ack_wait": 1.5, "retry_window": 0},
    ) as stack:
        run_id = await alice.start("travel", "Weather?", session_id="held")
        await asyncio.wait_for(model.reached.wait(), 10)  # the session is claimed
        cut_off = stack.services["gateway"]
        await stack.start_service(
            GatewayService,
            agents=AGENTS,
            verifier=TokenVerifier.from_file(),
            ack_wait=1.5,
            retry_window=0,
        )
        await cut_off.nc.close()  # no ack, no release reaches NATS
        finals = await _finals(alice, run_id)
        model.hold.clear()
        model.release.set()
        after = await alice.run("travel", "Weather?", session_id="held", timeout=20)

    assert len(finals) == 1
    assert isinstance(finals[0], RunFailed)
    assert finals[0].error.code == "dead_lettered"
    assert after.text.startswith("Done:")


async def test_an_attempt_whose_run_another_attempt_ended_records_that_end_not_its_own(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer, hold={0})
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ) as stack:
        run_id = await alice.start("travel", "Weather?", session_id="twice")
        await asyncio.wait_for(model.reached.wait(), 10)
        # Another attempt of the run (across a partition, say) failed it meanwhile.
        other_end = RunFailed(
            run_id=run_id, error=ErrorInfo(code="dead_lettered", message="attempted 4 times")
        )
        await (
            stack.services["gateway"]
            .nc.jetstream()
            .publish(
                subjects.events("acme", "alice", run_id),
                encode(other_end),
                headers={MSG_ID: f"{Owner('acme', 'alice').key(run_id)}:{FINAL}"},
            )
        )
        model.release.set()
        records = _queue(stack).records
        record = await eventually(
            lambda: records.stored("acme", "alice", run_id), what="the run's record"
        )
        finals = await _finals(alice, run_id)

    assert len(model.requests) == 2  # this attempt ran to its end
    assert finals == [other_end]
    assert record is not None
    assert record.status == "failed"
    assert record.error == other_end.error


async def test_a_failure_whose_dead_letter_was_not_stored_is_dead_lettered_again(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(request: ModelRequest, step: int) -> object:
        raise RuntimeError("this request always breaks the model")

    model = GatedModel(explode)  # type: ignore[arg-type]
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ) as stack:
        book = _queue(stack).book
        publish = book.bus.stream_publish
        refused: list[str] = []

        async def publish_failing_once(
            subject: str, data: bytes, headers: dict[str, str]
        ) -> PubAck:
            if subject.startswith(subjects.dead("")) and not refused:
                refused.append(subject)
                raise Unavailable("the dead letters have no leader")
            return await publish(subject, data, headers)

        monkeypatch.setattr(book.bus, "stream_publish", publish_failing_once)
        run_id = await alice.start("travel", "poison", session_id="dead")
        finals = await _finals(alice, run_id)
        js = stack.services["gateway"].nc.jetstream()
        dead = await eventually(
            lambda: js.get_last_msg(subjects.DEAD_STREAM, subjects.dead("travel")),
            retrying=(NotFoundError,),
            what="the dead letter",
        )

    assert refused
    assert len(finals) == 1
    assert len(model.requests) == 1
    assert b'"run_id":"' + run_id.encode() in (dead.data or b"")


async def test_a_failure_whose_session_release_did_not_reach_history_is_ended_again(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(request: ModelRequest, step: int) -> object:
        raise RuntimeError("this request always breaks the model")

    model = GatedModel(explode)  # type: ignore[arg-type]
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ) as stack:
        ports = _queue(stack).ports
        append = ports.append_history
        releases: list[bool] = []

        async def history_out_of_reach_once(
            ctx: RunContext, messages: list[ChatMessage], **kw: object
        ) -> object:
            if kw.get("abandon"):
                releases.append(True)
                if len(releases) == 1:  # as when history has no quorum
                    raise Unavailable("no reply on 'runbus.history.append' within 3.0s")
            return await append(ctx, messages, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(ports, "append_history", history_out_of_reach_once)
        run_id = await alice.start("travel", "poison", session_id="held-once")
        finals = await _finals(alice, run_id)
        model.replies = weather_then_answer
        # Free at once: a run on the session neither waits for nor is refused by a claim.
        after = await alice.run("travel", "Weather?", session_id="held-once", timeout=20)

    assert len(releases) == 2
    assert len(finals) == 1
    assert isinstance(finals[0], RunFailed)
    assert after.text.startswith("Done:")
