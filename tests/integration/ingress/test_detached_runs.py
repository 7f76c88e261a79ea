"""A run is there from the moment its request is accepted: a detached run can be read (status
`queued`) and followed at once, even while every slot is taken; to its owner only."""

from pathlib import Path

import aiohttp
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages.runs import RunGet
from runbus_gateway.api import QUEUE_RECENT
from tests.integration.ingress.conftest import ALICE, BOB, ingress, one_slot_taken
from tests.integration.ingress.test_runs_api import read_sse
from tests.stack import SecuredNats

CAROL = {"Authorization": "Bearer dev-carol"}
"""A user of another tenant (globex; alice and bob are acme's)."""


async def test_a_detached_run_is_queued_and_followable_at_once_while_every_slot_is_taken(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    async with (
        one_slot_taken(nats_server, tmp_path, alice) as model,
        ingress(nats_server.url, keepalive=0.1) as (_, http),
    ):
        body = {"agent": "travel", "text": "Weather?", "session_id": "waiting"}
        async with http.post("/v1/runs?detach=true", json=body, headers=ALICE) as response:
            detached_status = response.status
            run_id = (await response.json())["run_id"]
        async with http.get(f"/v1/runs/{run_id}", headers=ALICE) as response:
            record = await response.json()
        on_the_bus = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        async with http.get(f"/v1/runs/{run_id}/events", headers=ALICE) as response:
            opening = await response.content.readuntil(b"\n\n")
            model.release.set()
            events = await read_sse(response)

    assert detached_status == 202
    assert (record["status"], record["agent"], record["session_id"]) == (
        "queued",
        "travel",
        "waiting",
    )
    assert (record["tenant"], record["user_id"]) == ("acme", "alice")
    assert len(record["trace_id"]) == 32
    assert on_the_bus.record.status == "queued"
    assert opening == b": keepalive\n\n"
    assert [events[0].event, events[-1].event] == ["run.started", "run.completed"]


@pytest.mark.parametrize("attempt", range(10))
async def test_the_events_of_a_detached_run_are_followable_the_moment_it_is_accepted(
    http: aiohttp.ClientSession, attempt: int
) -> None:
    """Before a replica admits the run there is no record of it yet, only its request."""
    body = {"agent": "travel", "text": "Weather in Perth?"}
    async with http.post("/v1/runs?detach=true", json=body, headers=ALICE) as response:
        run_id = (await response.json())["run_id"]
    async with http.get(f"/v1/runs/{run_id}/events", headers=ALICE) as response:
        events = await read_sse(response)

    assert events[-1].event == "run.completed"


async def test_another_users_or_tenants_queued_run_is_not_found(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    async with (
        one_slot_taken(nats_server, tmp_path, alice) as model,
        ingress(nats_server.url) as (_, http),
    ):
        body = {"agent": "travel", "text": "Weather?", "session_id": "mine"}
        async with http.post("/v1/runs?detach=true", json=body, headers=ALICE) as response:
            run_id = (await response.json())["run_id"]
        refused = {}
        for name, caller in (("bob", BOB), ("carol", CAROL)):
            async with http.get(f"/v1/runs/{run_id}", headers=caller) as response:
                read = (response.status, (await response.json())["error"]["code"])
            async with http.get(f"/v1/runs/{run_id}/events", headers=caller) as response:
                followed = (response.status, (await response.json())["error"]["code"])
            refused[name] = (read, followed)
        nc = await nats.connect(nats_server.url)
        with pytest.raises(RemoteError) as on_the_bus:
            await RunbusClient(nc, token="dev-carol").call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        await nc.drain()
        async with http.get(f"/v1/runs/{run_id}", headers=ALICE) as response:
            own = (await response.json())["status"]
        model.release.set()

    assert refused == {
        "bob": ((404, "not_found"), (404, "not_found")),
        "carol": ((404, "not_found"), (404, "not_found")),
    }
    assert on_the_bus.value.known_code == "not_found"
    assert own == "queued"


async def test_a_run_queued_behind_many_others_is_queued_too(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    """The newest requests are read first; an older one is found reading the queue in order."""
    async with one_slot_taken(nats_server, tmp_path, alice) as model:
        early = await alice.start("travel", "Weather?", session_id="early")
        for index in range(2 * QUEUE_RECENT):
            await alice.start("travel", "Weather?", session_id=f"later-{index}")
        info = await alice.call(ops.API_RUNS_GET, RunGet(run_id=early))
        model.release.set()

    assert (info.record.status, info.record.session_id) == ("queued", "early")
