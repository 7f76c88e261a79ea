"""A run still waiting in the queue (every slot taken) is the owner's to cancel, as `runs.get`
already finds it there: it never runs, its followers read its end at once, its request leaves
the queue, and nobody else's cancel reaches it."""

from pathlib import Path

import pytest

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import RunCompleted, RunEvent, RunFailed
from runbus.messages.runs import RunCancel, RunGet
from tests.helpers import eventually
from tests.integration.ingress.conftest import one_slot_taken
from tests.stack import SecuredNats


async def _events(client: RunbusClient, run_id: str) -> list[RunEvent]:
    return [item.event async for item in client.follow(run_id, timeout=20)]


async def _queue_drained(client: RunbusClient) -> bool:
    info = await client.nc.jetstream().stream_info(subjects.RUNS_STREAM)
    return info.state.messages == 0


async def test_a_queued_run_s_cancel_finds_it_and_the_run_never_starts(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    async with one_slot_taken(nats_server, tmp_path, alice) as model:
        run_id = await alice.start("travel", "Weather in Perth?", session_id="s-queued")
        before = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        cancelled = await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        # Read while the slot is still taken: nobody waits for a slot to learn the end.
        told = await _events(alice, run_id)
        model.release.set()
        # The same session is free for the next run: the cancelled one never claimed it.
        following = await alice.run("travel", "Weather in Hobart?", session_id="s-queued")
        # Its request reaches a slot and is acked there without running.
        await eventually(lambda: _queue_drained(alice), 20, what="the run queue empty")
        after = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        stored = await _events(alice, run_id)

    assert before.record.status == "queued"
    assert cancelled.record.status == "cancelled"
    assert [type(e) for e in told] == [RunFailed]
    assert isinstance(told[0], RunFailed)
    assert told[0].error.code == "cancelled"
    assert following.run_id != run_id
    assert any("Hobart" in m.text for r in model.requests for m in r.messages)
    assert after.record.status == "cancelled"
    assert [type(e) for e in stored] == [RunFailed]
    assert not any("Perth" in m.text for r in model.requests for m in r.messages)


@pytest.mark.parametrize("name", ["bob", "carol"])
async def test_another_user_s_cancel_of_alice_s_queued_run_finds_nothing_and_it_runs(
    name: str, nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice, intruder = users["alice"], users[name]
    async with one_slot_taken(nats_server, tmp_path, alice) as model:
        run_id = await alice.start("travel", "Weather in Perth?", session_id="s-queued")
        with pytest.raises(RemoteError) as refused:
            await intruder.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        model.release.set()
        events = await _events(alice, run_id)

    assert refused.value.known_code == "not_found"
    assert isinstance(events[-1], RunCompleted)
    assert any("Perth" in m.text for r in model.requests for m in r.messages)
