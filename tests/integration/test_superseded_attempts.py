"""Two deliveries of one run alive at once — the server gave up on the first (a partition, a
paused process) and gave the run to another gateway — and then the first comes back: it stops
at its next boundary, acts on nothing, stores nothing more and ends nothing; the run ends
once, by the delivery that took it over."""

import asyncio
from pathlib import Path

import msgspec
import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runbus import subjects
from runbus.client import RunbusClient
from runbus.messages import ChatMessage, ModelRequest, RunCompleted, RunToolCall
from runbus.messages.history import BATCH_DECODER
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus.messages.tools import ApprovalRequest
from runbus.owners import Owner
from runbus.tokens import TokenVerifier
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.approvals import ApprovalRecord, Approvals, approval_key
from runbus_gateway.pauses import Pauses
from runbus_gateway.run.pause import NotPaused, PausePoint, Superseded
from runbus_gateway.service import GatewayService
from tests.helpers import eventually
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


class FirstCallHeld(GatedModel):
    """Holds only the first request it sees (the first delivery's first step); each request's
    tool call gets a new id, as a model sampled again would give."""

    async def complete(self, request: ModelRequest, on_delta):  # type: ignore[no-untyped-def]
        self.hold = {0} if not self.requests else set()
        return await super().complete(request, on_delta)


def weather_with_fresh_ids(model: GatedModel) -> "object":
    def reply(request: ModelRequest, step: int) -> ChatMessage:
        if step == 0:
            return call("get_weather", f"c-weather-{len(model.requests)}", city="Sydney")
        results = [r for m in request.messages for r in m.function_results]
        return text(f"Done: {results[-1].result if results else 'no result'}")

    return reply


async def _stored(nc: NATS, stream: str, subject: str) -> list[bytes]:
    js = nc.jetstream()
    reader = await js.pull_subscribe(
        subject,
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
    )
    found: list[bytes] = []
    try:
        while True:
            batch = await reader.fetch(256, timeout=5)
            found += [m.data for m in batch]
            if batch[-1].metadata.num_pending == 0:
                return found
    finally:
        await reader.unsubscribe()


async def test_a_delivery_the_server_gave_up_on_stops_when_it_comes_back_and_the_run_ends_once(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = FirstCallHeld(lambda request, step: text("unset"))
    model.replies = weather_with_fresh_ids(model)  # type: ignore[assignment]
    with structlog.testing.capture_logs() as logs:
        async with start_stack(
            nats_server.url,
            data_dir=tmp_path,
            agents=AGENTS,
            routes={"gated": model},
            gateway_options={"ack_wait": 1.5, "run_concurrency": 1},
        ) as stack:
            first = stack.services["gateway"]
            assert isinstance(first, GatewayService)
            assert first._consumer is not None
            # Its heartbeats stop reaching the server (as across a partition): the server
            # gives the run to another gateway after ack_wait.
            first._consumer.heartbeat = 3600.0
            run_id = await alice.start("travel", "Weather?", session_id="twice")
            await asyncio.wait_for(model.reached.wait(), 10)
            await stack.start_service(
                GatewayService, agents=AGENTS, verifier=TokenVerifier.from_file(), ack_wait=1.5
            )
            done = [i.event async for i in alice.follow(run_id, timeout=30)][-1]
            model.release.set()  # the first delivery comes back, with its model's reply
            await eventually(
                lambda: any(e.get("event") == "run_superseded" for e in logs),
                what="the first delivery to stop",
            )
            nc = stack.services["history"].nc
            events = [
                RUN_EVENT_DECODER.decode(data)
                for data in await _stored(
                    nc, subjects.EVENTS_STREAM, subjects.events("acme", "alice", run_id)
                )
            ]
            batches = [
                BATCH_DECODER.decode(data)
                for data in await _stored(
                    nc, subjects.HISTORY_STREAM, subjects.history_log("acme", "twice")
                )
            ]

    assert isinstance(done, RunCompleted)
    assert done.text.startswith("Done:")
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "RunCompleted", kinds
    assert kinds.count("RunCompleted") == 1, kinds
    calls = [e for e in events if isinstance(e, RunToolCall)]
    # The taken-over delivery's call (a new id) never ran, nor was it stored.
    assert len(calls) == 1, kinds
    ids = [m.message_id for b in batches for m in b.messages]
    assert len(ids) == len(set(ids)), ids
    assert [b.closed_run for b in batches if b.closed_run] == [run_id]
    superseded = [e for e in logs if e.get("event") == "run_superseded"]
    assert [e["attempt"] for e in superseded] == [1]
    # Three model requests: the held one, then the later delivery's two steps.
    assert len(model.requests) == 3


async def test_a_later_delivery_fences_the_earlier_ones_through_pauses_and_never_backwards(
    nc: NATS,
) -> None:
    kv = await nc.jetstream().create_key_value(bucket="fences")
    pauses = Pauses(kv)
    owner = Owner("acme", "alice")
    first = PausePoint(pauses, owner, _never_paused, attempt=1)
    third = PausePoint(pauses, owner, _never_paused, attempt=3)

    await first.current("r1")  # nothing written yet: the first delivery is current
    await pauses.fence(owner, "r1", 3)
    await pauses.fence(owner, "r1", 2)  # a slower, older delivery starting late
    with pytest.raises(Superseded) as superseded:
        await first.current("r1")
    await third.current("r1")
    with pytest.raises(NotPaused, match="no pause"):
        await pauses.resume(owner, "r1")  # a fence is not a pause
    asked = await pauses.request(owner, "r1")
    resumed = await pauses.resume(owner, "r1")
    with pytest.raises(Superseded):
        await first.current("r1")

    assert superseded.value.latest == 3
    assert (asked.generation, asked.attempt, resumed.attempt) == (1, 3, 3)
    other = await pauses.get(Owner("acme", "bob"), "r1")
    assert other is None  # another owner's run of the same id is not fenced


async def _never_paused(paused: bool) -> None:
    raise AssertionError("no run pauses here")


async def test_a_runs_approvals_are_listed_and_withdrawn_beside_its_fence_record(
    nc: NATS,
) -> None:
    # Every delivery after the first writes the run's pause record, in the approvals bucket:
    # reading the run's approvals must not trip over it.
    approvals = await Approvals.open(nc)
    owner = Owner("acme", "alice")
    await Pauses(approvals.bucket.kv).fence(owner, "r1", 2)
    request = ApprovalRequest(
        tool="create_booking", arguments={}, reason="over the limit", expires_at=4e9, digest="d"
    )
    pending = ApprovalRecord(
        run_id="r1", call_id="c-book", tenant="acme", user_id="alice", request=request
    )
    await approvals.bucket.create(approval_key(owner, "r1", "c-book"), pending)

    listed = await approvals.pending("acme", "alice", "r1")
    withdrawn = await approvals.withdraw("acme", "alice", "r1")
    after = await approvals.pending("acme", "alice", "r1")

    assert listed == ["c-book"]
    assert withdrawn == 1
    assert after == []
