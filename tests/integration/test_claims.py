"""Every claim is released on every failure path: a run that fails at its start because memory
or the tool catalogue is down leaves its session free, its approvals closed, and the next run
on the same session runs at once."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient, RunFailedError
from runbus.errors import RemoteError
from runbus.messages import ModelRequest, RunCompleted, RunFailed
from runbus.messages.runs import (
    ApprovalDecide,
    RunCancel,
    RunGet,
)
from runbus.service import Service
from runbus_examples import AGENTS_DIR
from runbus_examples.travel import ledger
from runbus_examples.travel import tools as travel_tools
from runbus_gateway.agents import load_agents
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.service import MemoryService
from runbus_tool_executor.service import ToolExecutorService
from tests.helpers import approval_requested
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, Stack, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


def book(request: ModelRequest, step: int) -> Any:
    if not any(m.function_results for m in request.messages):
        return call("create_booking", "c-book", flight_id="QF412-20261208", cabin="business")
    return text("Done.")


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    nc = await nats.connect(nats_server.url)
    yield RunbusClient(nc, token="dev-alice")
    await nc.drain()


async def _take_down(service: Service) -> None:
    """Its endpoints stop answering (the rest of it is stopped with the stack)."""
    assert service._micro is not None
    await service._micro.stop()
    service._micro = None


async def _bring_back(stack: Stack, down: str, data: Path) -> None:
    if down == "memory":
        embedder = HashingEmbedder()
        store = await EdgeStore.open(data / "qdrant-again", embedder.dimension)
        await stack.start_service(MemoryService, embedder=embedder, store=store)
    else:
        await stack.start_service(ToolExecutorService, registries=[travel_tools])


@pytest.mark.parametrize("down", ["memory", "tool_executor"])
async def test_a_run_that_fails_at_its_start_leaves_the_session_free_for_the_next_run(
    stack: Stack, alice: RunbusClient, tmp_path: Path, down: str
) -> None:
    await _take_down(stack.services[down])

    with pytest.raises(RunFailedError) as failed:
        await alice.run("travel", "I live in Melbourne.", session_id="claims", timeout=60)
    first = await alice.call(ops.API_RUNS_GET, RunGet(run_id=failed.value.event.run_id))
    await _bring_back(stack, down, tmp_path)
    after = await alice.run("travel", "What's the weather in Sydney?", session_id="claims")

    assert failed.value.remote_code in ("unavailable", "dead_lettered")
    assert first.record.status == "failed"
    assert after.text


async def test_a_cancelled_run_leaves_no_approval_anyone_could_still_grant(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(book)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        run_id = await alice.start("travel", "Book QF412 in business", session_id="cancel")
        asked = await approval_requested(alice, run_id)
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        finals = [
            i.event
            async for i in alice.follow(run_id, timeout=20)
            if isinstance(i.event, RunCompleted | RunFailed)
        ]
        with pytest.raises(RemoteError) as late:
            await alice.call(
                ops.API_APPROVALS_DECIDE,
                ApprovalDecide(run_id=run_id, call_id=asked.call_id, decision="approved"),
            )
        after = await alice.run("travel", "Anything else?", session_id="cancel")

    assert [type(e) for e in finals] == [RunFailed]
    assert isinstance(finals[0], RunFailed)
    assert finals[0].error.code == "cancelled"
    assert late.value.remote_code == "conflict"
    assert "expired" in late.value.message
    assert ledger.count(run_id) == 0
    assert after.text


async def test_a_reply_with_too_many_tool_calls_fails_once_with_its_limit_and_runs_none(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    def flood(request: ModelRequest, step: int) -> Any:
        if request.messages[-1].text != "Weather everywhere?":
            return text("Fine.")
        many = [call("get_weather", f"c{i}", city="Sydney") for i in range(200)]
        return msgspec.structs.replace(many[0], contents=[c for m in many for c in m.contents])

    capped = {"travel": msgspec.structs.replace(AGENTS["travel"], max_tool_calls=16)}
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=capped, routes={"gated": GatedModel(flood)}
    ) as stack:
        with pytest.raises(RunFailedError) as failed:
            await alice.run("travel", "Weather everywhere?", session_id="flood")
        record = await alice.call(ops.API_RUNS_GET, RunGet(run_id=failed.value.event.run_id))
        after = await alice.run("travel", "Anything else?", session_id="flood")
        tool_calls = _served(stack, "get_weather")

    assert failed.value.remote_code == "tool_call_limit"
    assert "allows 16" in str(failed.value)
    assert "max_tool_calls" in str(failed.value)
    assert (record.record.status, record.record.attempts) == ("failed", 1)
    assert tool_calls == 0
    assert after.text == "Fine."


def _served(stack: Stack, tool: str) -> int:
    service = stack.services["tool_executor"]
    assert service._micro is not None
    return sum(e.num_requests for e in service._micro.stats().endpoints if e.name.endswith(tool))
