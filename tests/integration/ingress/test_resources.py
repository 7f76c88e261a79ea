"""Sessions, transcripts, memories, agents and approvals over HTTP, each for its owner alone:
another user's ids answer 404 exactly like ids that do not exist."""

from typing import Any

import aiohttp

from runbus.client import RunbusClient
from tests.helpers import eventually
from tests.integration.ingress.conftest import ALICE, BOB


async def _json(
    http: aiohttp.ClientSession, method: str, path: str, headers: dict[str, str]
) -> tuple[int, Any]:
    async with http.request(method, path, headers=headers) as response:
        return response.status, await response.json()


async def _memories(http: aiohttp.ClientSession) -> list[dict[str, Any]]:
    """alice's memories once the memory service has written the one her run stated (writes
    are applied in the background: nothing announces them)."""

    async def listed() -> list[dict[str, Any]]:
        return list((await _json(http, "GET", "/v1/memories", ALICE))[1]["memories"])

    return await eventually(listed, what="alice's memory written")


async def test_sessions_transcripts_and_runs_are_the_owners_alone(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    done = await alice.run("travel", "Weather in Sydney?", session_id="iso-a", run_id="r-iso")

    _, alices = await _json(http, "GET", "/v1/sessions", ALICE)
    _, bobs = await _json(http, "GET", "/v1/sessions", BOB)
    transcript = await _json(http, "GET", "/v1/sessions/iso-a/messages", ALICE)
    session = await _json(http, "GET", "/v1/sessions/iso-a", ALICE)
    _, runs = await _json(http, "GET", "/v1/runs?session_id=iso-a", ALICE)
    _, bobs_runs = await _json(http, "GET", "/v1/runs?session_id=iso-a", BOB)
    refused = [
        await _json(http, "GET", "/v1/sessions/iso-a", BOB),
        await _json(http, "GET", "/v1/sessions/iso-a/messages", BOB),
        await _json(http, "POST", "/v1/runs/r-iso/approvals/c-1", BOB),
    ]

    assert [s["session_id"] for s in alices["records"]] == ["iso-a"]
    assert bobs["records"] == []
    assert transcript[0] == 200
    assert transcript[1]["messages"][0]["contents"][0]["text"] == "Weather in Sydney?"
    assert transcript[1]["messages"][-1]["contents"][0]["text"] == done.text
    assert (session[0], session[1]["owner"]) == (200, "alice")
    assert [r["run_id"] for r in runs["records"]] == ["r-iso"]
    assert bobs_runs["records"] == []
    assert [(status, body["error"]["code"]) for status, body in refused[:2]] == [
        (404, "not_found")
    ] * 2
    assert refused[2][0] == 400  # no decision in the body: refused before anything is asked


async def test_a_memory_is_forgotten_by_its_owner_and_not_by_anyone_else(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    await alice.run("travel", "Remember that I always want an aisle seat.", session_id="iso-m")
    memory = (await _memories(http))[0]
    path = f"/v1/memories/{memory['memory_id']}"

    bobs_try = await _json(http, "DELETE", path, BOB)
    still = [
        m["memory_id"] for m in (await _json(http, "GET", "/v1/memories", ALICE))[1]["memories"]
    ]
    alices = await _json(http, "DELETE", path, ALICE)
    after = (await _json(http, "GET", "/v1/memories", ALICE))[1]["memories"]

    assert (bobs_try[0], bobs_try[1]["error"]["code"]) == (404, "not_found")
    assert memory["memory_id"] in still
    assert alices == (200, {"type": "memory.forgotten", "forgotten": 1})
    assert memory["memory_id"] not in [m["memory_id"] for m in after]


async def test_another_users_approval_is_not_found(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    await alice.run("travel", "Weather in Hobart?", session_id="iso-p", run_id="r-iso-p")
    decision = {"decision": "approved"}
    async with http.post("/v1/runs/r-iso-p/approvals/c-x", json=decision, headers=BOB) as r:
        bobs = (r.status, (await r.json())["error"]["code"])
    async with http.get("/v1/agents", headers=BOB) as r:
        agents = [a["name"] for a in (await r.json())["agents"]]

    assert bobs == (404, "not_found")
    assert "travel" in agents
