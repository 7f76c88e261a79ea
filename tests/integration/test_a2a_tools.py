"""Remote A2A agents as tools, against an agent written with the a2a-sdk's own server and an
agent of a second runbus stack behind its A2A ingress: its answer is the call's result, a
question it asks pauses the run as an approval does and the owner's answer goes back to it, a
cancel of the run and a deadline cancel its task, and a wrong credential is an error the model
reads."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import nats
import pytest
from nats.js.errors import NoKeysError
from nats.js.kv import KeyValue

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.messages import RunCompleted, RunFailed, RunToolCall, RunToolProgress
from runbus.messages.runs import ApprovalDecide, RunCancel, RunList, RunStatus
from runbus.owners import Owner
from runbus.tokens import TokenVerifier
from runbus_gateway.agents import AgentSpec, RemoteAgent
from runbus_gateway.service import GatewayService
from runbus_ingress.server import listening
from tests.a2a_agent_server import TOKEN, Seen, rates_agent
from tests.helpers import approval_requested, eventually, take_time
from tests.multi_agent import FLIGHTS, AgentsModel
from tests.stack import SecuredNats, Stack, secured_nats, start_stack


def fx(url: str, *, token_env: str = "RATES_TOKEN", timeout: float = 30.0) -> AgentSpec:
    return AgentSpec(
        name="fx",
        instructions="You are fx: ask the rates agent.",
        model="agents",
        remote_agents=[
            RemoteAgent(
                name="rates",
                url=url,
                description="Exchange rates",
                token_env=token_env,
                timeout=timeout,
            )
        ],
    )


def stack(
    nats_server: SecuredNats, data_dir: Path, agent: AgentSpec
) -> AbstractAsyncContextManager[Stack]:
    return start_stack(
        nats_server.url,
        data_dir=data_dir,
        agents={agent.name: agent},
        routes={"agents": AgentsModel()},
    )


@pytest.fixture
async def rates(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, Seen]]:
    monkeypatch.setenv("RATES_TOKEN", TOKEN)
    monkeypatch.setenv("WRONG_TOKEN", "guess")
    async with rates_agent() as served:
        yield served


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    client = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    yield client
    await client.nc.drain()


async def final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


async def test_a_remote_a2a_agents_answer_is_the_tool_result(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    url, seen = rates
    async with stack(nats_server, tmp_path, fx(url)):
        run_id = await alice.start("fx", "rate AUD USD", session_id="fx")
        ended = await final(alice, run_id)

    assert isinstance(ended, RunCompleted)
    assert ended.text == "fx heard: 1 AUD is 0.65 USD"
    assert seen.inputs == ["rate AUD USD"]


async def test_a_remote_agent_asking_for_input_pauses_the_run_until_its_owner_answers(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    """The owner takes longer than the agent's timeout: a person's time does not count."""
    url, seen = rates
    async with stack(nats_server, tmp_path, fx(url, timeout=1.0)):
        run_id = await alice.start("fx", "convert 100 AUD", session_id="fx")
        asked = await approval_requested(alice, run_id)
        await take_time(1.5)  # the person thinks it over
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved", note="USD"),
        )
        ended = await final(alice, run_id)

    assert (asked.tool, asked.reason) == ("rates", "rates asks: Which currency?")
    assert isinstance(ended, RunCompleted)
    assert ended.text == "fx heard: 100 AUD is 65 USD"
    assert seen.inputs == ["convert 100 AUD", "USD"]


async def test_cancelling_the_run_cancels_the_remote_task(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    url, seen = rates
    async with stack(nats_server, tmp_path, fx(url)):
        run_id = await alice.start("fx", "slow rate", session_id="fx")
        await asyncio.wait_for(seen.working.wait(), 10)
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        ended = await final(alice, run_id)
        cancelled = await eventually(lambda: seen.cancelled)

    assert isinstance(ended, RunFailed)
    assert ended.error.code == "cancelled"
    assert len(cancelled) == 1


async def test_a_remote_agent_past_its_timeout_is_cancelled_and_the_model_reads_why(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    url, seen = rates
    async with stack(nats_server, tmp_path, fx(url, timeout=1.0)):
        run_id = await alice.start("fx", "slow rate", session_id="fx")
        ended = await final(alice, run_id)
        cancelled = await eventually(lambda: seen.cancelled)

    assert isinstance(ended, RunCompleted)
    assert ended.text == "fx heard: deadline_exceeded: 'rates' did not answer in 1s"
    assert len(cancelled) == 1


async def test_a_wrong_credential_is_an_error_the_model_reads(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    url, seen = rates
    async with stack(nats_server, tmp_path, fx(url, token_env="WRONG_TOKEN")):
        run_id = await alice.start("fx", "rate AUD USD", session_id="fx")
        ended = await final(alice, run_id)

    assert isinstance(ended, RunCompleted)
    assert ended.text.startswith("fx heard: remote agent 'rates': ")
    assert "401" in ended.text
    assert seen.inputs == []


async def test_an_agent_of_another_runbus_stack_answers_through_a2a_and_a_cancel_reaches_it(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    """The remote is a second runbus stack (its own NATS, its own users): the call is bob's
    run there, made with bob's token there."""
    remote_model = AgentsModel(hold={("flights", 0)})
    async with (
        secured_nats(tmp_path / "remote-bus") as remote_bus,
        start_stack(
            remote_bus.url,
            data_dir=tmp_path / "remote",
            agents={"flights": FLIGHTS},
            routes={"agents": remote_model},
        ),
        listening(remote_bus.client_url, "127.0.0.1", 0) as base,
    ):
        desk = AgentSpec(
            name="desk",
            instructions="You are desk: ask the remote flights agent.",
            model="agents",
            remote_agents=[
                RemoteAgent(name="flights", url=f"{base}/v1/a2a/flights", token_env="REMOTE_TOKEN")
            ],
        )
        bob = RunbusClient(await nats.connect(remote_bus.url), token="dev-bob")
        try:
            with pytest.MonkeyPatch.context() as env:
                env.setenv("REMOTE_TOKEN", "dev-bob")
                async with stack(nats_server, tmp_path / "local", desk):
                    answered = await alice.start("desk", "Flights?", session_id="desk")
                    await asyncio.wait_for(remote_model.reached.wait(), 10)
                    remote_model.release.set()
                    first = await final(alice, answered)

                    remote_model.release.clear()
                    remote_model.reached.clear()
                    cancelled = await alice.start("desk", "Flights again?", session_id="desk2")
                    await asyncio.wait_for(remote_model.reached.wait(), 10)
                    await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=cancelled))
                    second = await final(alice, cancelled)

                    async def bobs_runs() -> list[RunStatus]:
                        listed = await bob.call(ops.API_RUNS_LIST, RunList())
                        statuses = sorted(r.status for r in listed.records)
                        return statuses if "running" not in statuses else []

                    remote_runs = await eventually(bobs_runs)
        finally:
            remote_model.release.set()
            await bob.nc.drain()

    assert isinstance(first, RunCompleted)
    assert first.text == "desk heard: QF1 09:00 for 'SYD to MEL on Friday'"
    assert isinstance(second, RunFailed)
    assert second.error.code == "cancelled"
    assert remote_runs == ["cancelled", "completed"]


async def test_a_run_resumed_after_its_gateway_died_follows_the_remote_task_it_started(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    url, seen = rates
    agent = fx(url)
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents={"fx": agent},
        routes={"agents": AgentsModel()},
        gateway_options={"ack_wait": 1.0},
    ) as running:
        run_id = await alice.start("fx", "held rate", session_id="fx")
        await asyncio.wait_for(seen.working.wait(), 10)
        approvals = await alice.nc.jetstream().key_value(subjects.APPROVALS_BUCKET)
        await eventually(lambda: _keys(approvals, f"acme.alice.{run_id}.a2a."))
        doomed = running.services["gateway"]
        second = await running.start_service(
            GatewayService, agents={"fx": agent}, verifier=TokenVerifier.from_file(), ack_wait=1.0
        )
        assert isinstance(second, GatewayService)
        await doomed.nc.close()  # the replica vanishes mid-call: no ack, no cleanup
        await eventually(lambda: second.runs.held(Owner("acme", "alice"), run_id))
        seen.release.set()
        ended = await final(alice, run_id)

    assert isinstance(ended, RunCompleted)
    assert ended.text == "fx heard: 1 AUD is 0.65 USD"
    assert seen.inputs == ["held rate"]  # the message was sent once
    assert seen.cancelled == []


async def _keys(kv: KeyValue, prefix: str) -> list[str]:
    try:
        return [k for k in await kv.keys() if k.startswith(prefix)]
    except NoKeysError:
        return []


async def test_a_remote_agents_status_updates_become_progress_events_before_its_result(
    nats_server: SecuredNats, tmp_path: Path, rates: tuple[str, Seen], alice: RunbusClient
) -> None:
    url, _ = rates
    async with stack(nats_server, tmp_path, fx(url)):
        run_id = await alice.start("fx", "rate AUD USD", session_id="fx-progress")
        events = [item.event async for item in alice.follow(run_id, timeout=20)]

    progress = [e for e in events if isinstance(e, RunToolProgress)]
    kinds = [type(e).__name__ for e in events]
    assert [(p.tool, p.state, p.text) for p in progress] == [("rates", "working", "looking it up")]
    assert (
        kinds.index("RunToolCall") < kinds.index("RunToolProgress") < kinds.index("RunToolResult")
    )
    calls = [e for e in events if isinstance(e, RunToolCall)]
    assert progress[0].call_id == calls[0].call.call_id
