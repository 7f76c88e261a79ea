"""Nobody can deny another user a run id: bob (another user of alice's tenant) and carol
(another tenant), with valid credentials, publish the run id alice is about to use first, by
hand, under every dedupe key they can make; alice's run of that id still runs, as hers, and
theirs run as theirs. A client retrying its own publish is still deduplicated."""

from typing import Any, Final

import aiohttp
import msgspec
import pytest

import runbus.client
from runbus import ops, session_ids, subjects
from runbus.client import RunFailedError
from runbus.errors import RemoteError
from runbus.messages import HistoryLoad, RunCompleted, RunStarted
from runbus.messages.sessions import SessionExport, SessionImport
from runbus.tokens import run_msg_id
from runbus_ingress.server import listening
from tests.helpers import raw_request
from tests.stack import SecuredNats, Stack

INTRUDERS: Final = {"bob": ("acme", "bob"), "carol": ("globex", "carol")}


async def _squat(nats_server: SecuredNats, name: str, run_id: str) -> bool:
    """Publish a run of `run_id` as `name` under the bare id (the key every client sent before
    keys named their credential); whether JetStream took it."""
    nc = await runbus.client.open_connection(nats_server.client_url, f"dev-{name}")
    try:
        ack = await nc.jetstream().publish(
            subjects.runs("travel"),
            raw_request(run_id, "Weather in Hobart?", session_id=f"s-{name}"),
            headers={"rb-auth": f"Bearer dev-{name}", "Nats-Msg-Id": run_id},
        )
    finally:
        await nc.drain()
    return not ack.duplicate


@pytest.mark.parametrize("name", sorted(INTRUDERS))
async def test_a_run_id_another_user_publishes_first_is_still_alice_s_to_run(
    name: str, stack: Stack, nats_server: SecuredNats
) -> None:
    run_id = f"r-squatted-{name}"
    taken = await _squat(nats_server, name, run_id)
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        stream = alice.stream("travel", "Weather in Sydney?", session_id="s", run_id=run_id)
        events = [event async for event in stream]
    async with runbus.client.connect(nats_server.client_url, token=f"dev-{name}") as intruder:
        theirs = [item.event async for item in intruder.follow(run_id, timeout=20)]

    assert taken
    assert isinstance(events[-1], RunCompleted)
    assert "Sydney" in events[-1].text
    assert isinstance(theirs[-1], RunCompleted)
    assert "Hobart" in theirs[-1].text
    # No key another credential can make is alice's.
    assert run_msg_id("dev-alice", run_id) not in {run_id, run_msg_id(f"dev-{name}", run_id)}


async def test_a_client_retrying_its_own_publish_runs_it_once(
    stack: Stack, nats_server: SecuredNats
) -> None:
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        first = await alice.start("travel", "Weather in Perth?", session_id="s-r", run_id="r-twice")
        again = await alice.start("travel", "Weather in Perth?", session_id="s-r", run_id="r-twice")
        events = [item.event async for item in alice.follow("r-twice", timeout=20)]

    assert first == again == "r-twice"
    assert [type(e) for e in events].count(RunStarted) == 1
    assert isinstance(events[-1], RunCompleted)


async def _chat(base: str, name: str, user: str, text: str) -> dict[str, Any]:
    """A chat completion of `name`'s through the ingress, the session named by OpenAI `user`."""
    body = {"model": "travel", "messages": [{"role": "user", "content": text}], "user": user}
    async with (
        aiohttp.ClientSession(base, timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer dev-{name}"}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def _said(client: runbus.client.RunbusClient, session_id: str) -> list[str]:
    loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
    return [m.text for m in loaded.messages if m.role == "user"]


@pytest.mark.parametrize("name", sorted(INTRUDERS))
async def test_an_openai_user_another_user_names_first_is_still_alice_s_session(
    name: str, stack: Stack, nats_server: SecuredNats
) -> None:
    async with listening(nats_server.client_url, "127.0.0.1", 0) as base:
        theirs = await _chat(base, name, "traveller", "Weather in Hobart?")
        first = await _chat(base, "alice", "traveller", "Weather in Sydney?")
        again = await _chat(base, "alice", "traveller", "And in Perth?")
    mine = session_ids.scoped("acme", "alice", "traveller")
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        said = await _said(alice, mine)

    assert first["runbus"]["session_id"] == again["runbus"]["session_id"] == mine
    assert theirs["runbus"]["session_id"] == session_ids.scoped(*INTRUDERS[name], "traveller")
    assert theirs["runbus"]["session_id"] != mine
    # Her own repeated `user` goes on in one session, and only her words are in it.
    assert said == ["Weather in Sydney?", "And in Perth?"]


@pytest.mark.parametrize("name", sorted(INTRUDERS))
async def test_a_session_id_scoped_to_alice_is_refused_to_anyone_else_who_names_it(
    name: str, stack: Stack, nats_server: SecuredNats
) -> None:
    mine = session_ids.scoped("acme", "alice", "traveller")
    async with runbus.client.connect(nats_server.client_url, token=f"dev-{name}") as intruder:
        with pytest.raises(RunFailedError) as refused:
            await intruder.run("travel", "Weather in Hobart?", session_id=mine)
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        done = await alice.run("travel", "Weather in Sydney?", session_id=mine)
        said = await _said(alice, mine)

    assert refused.value.known_code == "not_found"
    assert isinstance(done, RunCompleted)
    assert said == ["Weather in Sydney?"]


async def test_an_explicit_session_id_is_held_by_the_first_user_of_its_tenant_to_name_it(
    stack: Stack, nats_server: SecuredNats
) -> None:
    """What holds for ids a client chooses itself (docs/security.md): first come within the
    tenant; another tenant's same id is another session."""
    async with (
        runbus.client.connect(nats_server.client_url, token="dev-alice") as alice,
        runbus.client.connect(nats_server.client_url, token="dev-bob") as bob,
        runbus.client.connect(nats_server.client_url, token="dev-carol") as carol,
    ):
        await alice.run("travel", "Weather in Sydney?", session_id="s-common")
        with pytest.raises(RunFailedError) as refused:
            await bob.run("travel", "Weather in Hobart?", session_id="s-common")
        other_tenant = await carol.run("travel", "Weather in Darwin?", session_id="s-common")
        said = await _said(alice, "s-common")

    assert refused.value.known_code == "not_found"
    assert isinstance(other_tenant, RunCompleted)
    assert said == ["Weather in Sydney?"]


@pytest.mark.parametrize("name", sorted(INTRUDERS))
async def test_a_session_imported_under_an_id_scoped_to_alice_is_refused(
    name: str, stack: Stack, nats_server: SecuredNats
) -> None:
    """The import makes a session as a run does: an id scoped to alice is hers alone."""
    mine = session_ids.scoped("acme", "alice", "traveller")
    tenant, user_id = INTRUDERS[name]
    async with runbus.client.connect(nats_server.client_url, token=f"dev-{name}") as intruder:
        await intruder.run("travel", "Weather in Hobart?", session_id=f"own-{name}")
        exported = await intruder.call(
            ops.api_op(ops.SESSIONS_EXPORT), SessionExport(session_id=f"own-{name}")
        )
        record = msgspec.structs.replace(exported.document.record, session_id=mine)
        document = msgspec.structs.replace(exported.document, record=record)
        with pytest.raises(RemoteError) as refused:
            await intruder.call(ops.api_op(ops.SESSIONS_IMPORT), SessionImport(document=document))
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        done = await alice.run("travel", "Weather in Sydney?", session_id=mine)
        said = await _said(alice, mine)

    assert (record.tenant, record.owner) == (tenant, user_id)
    assert refused.value.known_code == "not_found"
    assert isinstance(done, RunCompleted)
    assert said == ["Weather in Sydney?"]
