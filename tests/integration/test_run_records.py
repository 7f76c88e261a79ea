"""A run's record is written when its status is not already one of its events: a first
delivery in flight is read off its own events (runs.get, runs.list), its owner's only, and the
final record lands when it ends."""

from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import RunCompleted
from runbus.messages.runs import RunGet, RunList
from runbus.owners import Owner
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from tests.models import GatedModel, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


async def test_a_run_in_flight_is_read_off_its_events_by_its_owner_and_recorded_when_it_ends(
    nats_server: SecuredNats, tmp_path: Path, nc: NATS
) -> None:
    model = GatedModel(lambda request, step: text("Sunny."), hold={0})
    alice = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    carol = RunbusClient(await nats.connect(nats_server.url), token="dev-carol")
    try:
        async with start_stack(
            nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
        ):
            records = await nc.jetstream().key_value(subjects.RUN_STATE_BUCKET)
            run_id = await alice.start("travel", "Weather?", session_id="in-flight")
            await model.reached.wait()
            key = Owner("acme", "alice").key(run_id)
            with pytest.raises(KeyNotFoundError):
                await records.get(key)
            running = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
            listed = (await alice.call(ops.API_RUNS_LIST, RunList(limit=10))).records
            with pytest.raises(RemoteError) as other_owner:
                await carol.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
            carol_listed = (await carol.call(ops.API_RUNS_LIST, RunList(limit=10))).records
            model.release.set()
            final = [i.event async for i in alice.follow(run_id, timeout=20)][-1]
            done = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
            stored = await records.get(key)
    finally:
        for client in (alice, carol):
            await client.nc.drain()

    assert (running.status, running.agent, running.session_id) == ("running", "travel", "in-flight")
    assert (running.tenant, running.user_id, running.attempts) == ("acme", "alice", 1)
    assert len(running.trace_id) == 32
    assert [(r.run_id, r.status) for r in listed] == [(run_id, "running")]
    assert other_owner.value.remote_code == "not_found"
    assert carol_listed == []
    assert isinstance(final, RunCompleted)
    assert (done.status, done.text) == ("completed", "Sunny.")
    assert stored.value is not None
    assert b'"completed"' in stored.value
