"""Handoffs: an agent hands the conversation to another with a `transfer_to_<agent>` call;
the call is in the session's history, the session's next runs go to the agent that holds it
(until it hands it back, or for one run when it holds for a run), and the runs' records name
the agent that ran them."""

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import ChatMessage, HistoryLoad, ModelRequest, RunCompleted
from runbus.messages.runs import RunGet
from runbus_gateway.agents import AgentSpec
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, Stack, start_stack

DESK = AgentSpec(name="desk", instructions="You are desk.", model="gated", handoffs=["billing"])
BILLING = AgentSpec(
    name="billing", instructions="You are billing.", model="gated", handoffs=["desk"]
)


def answer(request: ModelRequest, step: int) -> ChatMessage:
    """Desk hands refunds to billing; billing hands the user back when they say thanks."""
    agent = next(m.text for m in request.messages if m.role == "system").split()[2].rstrip(".")
    said = [m.text for m in request.messages if m.role == "user"][-1]
    if step == 0 and agent == "desk" and "refund" in said:
        return call("transfer_to_billing", "c-handoff", reason="a refund")
    if step == 0 and agent == "billing" and "thanks" in said:
        return call("transfer_to_desk", "c-back")
    return text(f"{agent}: {said}")


def stack(
    nats_server: SecuredNats, data_dir: Path, billing: AgentSpec = BILLING
) -> AbstractAsyncContextManager[Stack]:
    return start_stack(
        nats_server.url,
        data_dir=data_dir,
        agents={"desk": DESK, "billing": billing},
        routes={"gated": GatedModel(answer)},
    )


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    client = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    yield client
    await client.nc.drain()


async def ask(client: RunbusClient, said: str, session_id: str) -> tuple[str, str]:
    """Run `said` addressed to desk: (the agent that ran it, its answer)."""
    done = await client.run("desk", said, session_id=session_id, timeout=20)
    record = (await client.call(ops.API_RUNS_GET, RunGet(run_id=done.run_id))).record
    return record.agent, done.text


async def test_a_handed_over_session_goes_to_its_holder_until_it_hands_it_back(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    async with stack(nats_server, tmp_path):
        handed = await ask(alice, "I want a refund", "help")
        held = await ask(alice, "Where is my money?", "help")
        back = await ask(alice, "thanks!", "help")
        again = await ask(alice, "Hello?", "help")
        elsewhere = await ask(alice, "Hello?", "other")
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="help"))

    assert handed == ("desk", "the conversation is now with the 'billing' agent")
    assert held == ("billing", "billing: Where is my money?")
    assert back == ("billing", "the conversation is now with the 'desk' agent")
    assert again == ("desk", "desk: Hello?")
    assert elsewhere == ("desk", "desk: Hello?")
    calls = [c.name for m in history.messages for c in m.function_calls]
    assert calls == ["transfer_to_billing", "transfer_to_desk"]


async def test_an_agent_that_holds_for_one_run_gives_the_session_back_after_it(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    once = msgspec.structs.replace(BILLING, handoff_holds="run")
    async with stack(nats_server, tmp_path, once):
        handed = await ask(alice, "I want a refund", "help")
        held = await ask(alice, "Where is my money?", "help")
        back = await ask(alice, "Hello?", "help")

    assert handed[0] == "desk"
    assert held == ("billing", "billing: Where is my money?")
    assert back == ("desk", "desk: Hello?")


async def test_another_tenants_session_of_the_same_id_is_not_handed_over(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    carol = RunbusClient(await nats.connect(nats_server.url), token="dev-carol")
    try:
        async with stack(nats_server, tmp_path):
            await ask(alice, "I want a refund", "help")
            carols = await carol.run("desk", "Hello?", session_id="help", timeout=20)
    finally:
        await carol.nc.drain()

    assert isinstance(carols, RunCompleted)
    assert carols.text == "desk: Hello?"
