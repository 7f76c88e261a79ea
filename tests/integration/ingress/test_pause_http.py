"""Pause, edit, resume and fork over HTTP: a paused run frees its slot (another run goes through
a gateway of one slot meanwhile), a bad edit is a 400 that leaves it paused, and another user
gets 404 for every one of them."""

import asyncio
from pathlib import Path

import aiohttp
import msgspec
import nats

from runbus.client import RunbusClient
from runbus.messages import ModelRequest, RunPaused
from tests.integration.ingress.conftest import ALICE, BOB, GATED_AGENTS, ingress
from tests.integration.ingress.test_runs_api import read_sse
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack


def weather(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    results = [r for m in request.messages for r in m.function_results]
    if not results:
        return call("get_weather", "c-weather", city="Sydney")
    return text(f"Weather for {results[-1].result['city']}")


async def status_of(response: aiohttp.ClientResponse) -> tuple[int, str]:
    body = await response.json()
    return response.status, body.get("status") or body.get("error", {}).get("code", "")


async def test_a_run_paused_over_http_frees_its_slot_takes_an_edit_resumes_and_forks(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    model = GatedModel(weather, hold={0})
    alice = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    async with (
        start_stack(
            nats_server.url,
            data_dir=tmp_path,
            agents=GATED_AGENTS,
            routes={"gated": model},
            gateway_options={"run_concurrency": 1},
        ),
        ingress(nats_server.client_url) as (_, http),
    ):
        body = {"agent": "travel", "text": "Weather?", "session_id": "held"}
        async with http.post("/v1/runs?detach=true", json=body, headers=ALICE) as response:
            run_id = (await response.json())["run_id"]
        await asyncio.wait_for(model.reached.wait(), 10)
        async with http.post(f"/v1/runs/{run_id}/pause", headers=ALICE) as response:
            asked = await status_of(response)
        model.release.set()
        async for item in alice.follow(run_id, timeout=20):
            if isinstance(item.event, RunPaused):
                break
        # The only slot is free: another run goes all the way through meanwhile.
        other = {"agent": "travel", "text": "And here?", "session_id": "other"}
        async with http.post("/v1/runs?wait=true", json=other, headers=ALICE) as response:
            meanwhile = (response.status, (await response.json())["text"])
        async with http.get(f"/v1/runs/{run_id}/pending", headers=ALICE) as response:
            pending = await response.json()
        bad_edit = {"replace": [{"call_id": "c-weather", "arguments": {"city": 7}}]}
        async with http.post(f"/v1/runs/{run_id}/edit", json=bad_edit, headers=ALICE) as response:
            refused = await status_of(response)
        async with http.get(f"/v1/runs/{run_id}", headers=ALICE) as response:
            still = (await response.json())["status"]
        foreign = []
        for method, path in (
            ("POST", "pause"),
            ("GET", "pending"),
            ("POST", "edit"),
            ("POST", "resume"),
            ("POST", "fork"),
        ):
            async with http.request(
                method,
                f"/v1/runs/{run_id}/{path}",
                json={"session_id": "stolen"} if path == "fork" else {},
                headers=BOB,
            ) as response:
                foreign.append(await status_of(response))
        edit = {"replace": [{"call_id": "c-weather", "arguments": {"city": "Perth"}}]}
        async with http.post(f"/v1/runs/{run_id}/edit", json=edit, headers=ALICE) as response:
            edited = await response.json()
        async with http.post(f"/v1/runs/{run_id}/resume", headers=ALICE) as response:
            resumed = await status_of(response)
        async with http.get(f"/v1/runs/{run_id}/events", headers=ALICE) as response:
            events = await read_sse(response)
        fork = {"session_id": "held-again", "checkpoint": 1}
        async with http.post(f"/v1/runs/{run_id}/fork", json=fork, headers=ALICE) as response:
            forked = (response.status, await response.json())
    await alice.nc.drain()

    assert asked == (202, "requested")
    assert meanwhile == (200, "Weather for Sydney")
    assert pending["status"] == "paused"
    assert [c["arguments"] for c in pending["calls"]] == [{"city": "Sydney"}]
    assert refused == (400, "bad_request")
    assert still == "paused"
    assert foreign == [(404, "not_found")] * 5
    assert [c["arguments"] for c in edited["calls"]] == [{"city": "Perth"}]
    assert resumed == (200, "resumed")
    kinds = [e.event for e in events]
    assert kinds.index("run.paused") < kinds.index("run.resumed") < kinds.index("run.tool_call")
    final = msgspec.json.decode(events[-1].data)
    assert (events[-1].event, final["text"]) == ("run.completed", "Weather for Perth")
    assert forked[0] == 201
    assert (forked[1]["session_id"], forked[1]["messages"]) == ("held-again", 1)
