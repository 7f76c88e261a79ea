"""A run still waiting in the queue (every slot taken) is the owner's to cancel, as `runs.get`
already finds it there."""

from pathlib import Path
from typing import Final

import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import RunCompleted, RunFailed
from runbus.messages.runs import RunCancel, RunGet
from tests.integration.ingress.conftest import one_slot_taken
from tests.stack import SecuredNats

QUEUED_CANCEL: Final = (
    "runs.cancel looks up the run's record only; a run still in the queue has none yet, so "
    "its cancel answers not_found (runs.get finds it in the queue)"
)


@pytest.mark.xfail(strict=True, raises=RemoteError, reason=QUEUED_CANCEL)
async def test_a_queued_run_s_cancel_finds_it_and_the_run_never_starts(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_server.url)
    alice = RunbusClient(nc, token="dev-alice")
    try:
        async with one_slot_taken(nats_server, tmp_path, alice) as model:
            run_id = await alice.start("travel", "Weather in Perth?", session_id="s-queued")
            before = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
            cancelled = await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
            model.release.set()
            finals = [
                item.event
                async for item in alice.follow(run_id, timeout=20)
                if isinstance(item.event, RunCompleted | RunFailed)
            ]
    finally:
        await nc.drain()

    assert before.record.status == "queued"
    assert cancelled.record.status in ("queued", "cancelled")
    assert len(finals) == 1
    assert isinstance(finals[0], RunFailed)
    assert finals[0].error.code == "cancelled"
    assert not any("Perth" in m.text for r in model.requests for m in r.messages)
