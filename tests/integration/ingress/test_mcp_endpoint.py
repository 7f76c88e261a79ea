"""runbus agents as MCP tools at `POST /v1/mcp`, driven by the `mcp` SDK's own client over
streamable HTTP: the handshake, one tool per agent, a call answered with the run's text (and its
steps as progress), failures and pending approvals as error results, cancellation, and every
run under the bearer token's own user."""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import mcp_types as types
import msgspec
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import HistoryLoad, RunCompleted, TextContent
from runbus.messages.runs import RunGet, RunList
from runbus_examples import AGENTS_DIR
from runbus_examples.scripted import ScriptedModel
from runbus_gateway.agents import load_agents
from tests.helpers import eventually
from tests.integration.ingress.conftest import ALICE, BOB, ingress
from tests.integration.ingress.test_a2a import BookingModel
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, start_stack

CAROL = {"Authorization": "Bearer dev-carol"}
TRAVEL = load_agents(AGENTS_DIR)["travel"]


def agent(name: str, model: str, description: str) -> object:
    return msgspec.structs.replace(TRAVEL, name=name, model=model, description=description)


AGENTS = {
    "travel": agent("travel", "gated", TRAVEL.description),
    "broken": agent("broken", "scripted/none", "Fails: its model has nothing to say"),
    "booker": agent("booker", "booking", "Books business class (needs approval)"),
    "slow": agent("slow", "held", "Waits for its model until released"),
}


class Served(msgspec.Struct):
    url: str
    held: GatedModel


@pytest.fixture
async def served_mcp(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Served]:
    held = GatedModel(weather_then_answer, hold={0})
    routes = {
        "gated": GatedModel(weather_then_answer),
        "scripted/none": ScriptedModel("none", []),
        "booking": BookingModel(),
        "held": held,
    }
    async with (
        start_stack(nats_server.url, data_dir=tmp_path, agents=AGENTS, routes=routes),  # type: ignore[arg-type]
        ingress(nats_server.url) as (base, _),
    ):
        yield Served(url=f"{base}/v1/mcp", held=held)


@asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    """The SDK's client, initialized, sending `headers` with every request."""
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


def run_id_of(result: types.CallToolResult) -> str:
    assert result.meta is not None
    run_id = result.meta["runbus/run_id"]
    assert isinstance(run_id, str)
    return run_id


async def completed(client: RunbusClient, run_id: str) -> RunCompleted:
    final = None
    async for item in client.follow(run_id, timeout=10):
        final = item.event
    assert isinstance(final, RunCompleted)
    return final


async def test_the_mcp_client_lists_one_tool_per_agent_it_may_run(served_mcp: Served) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        initialized = session.initialize_result
        listed = await session.list_tools()

    assert initialized is not None
    assert initialized.server_info.name == "runbus"
    assert initialized.capabilities.tools is not None
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == set(AGENTS)
    assert tools["travel"].description == TRAVEL.description
    assert tools["travel"].input_schema["required"] == ["input"]
    assert set(tools["travel"].input_schema["properties"]) == {"input", "session_id"}


async def test_a_call_runs_the_agent_as_the_caller_and_answers_with_its_final_text(
    served_mcp: Served, alice: RunbusClient
) -> None:
    notes: list[str | None] = []
    steps: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(progress)
        notes.append(message)

    async with mcp_session(served_mcp.url, ALICE) as session:
        result = await session.call_tool(
            "travel", {"input": "Weather in Sydney?"}, progress_callback=on_progress
        )
    run_id = run_id_of(result)
    final = await completed(alice, run_id)
    info = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))

    assert not result.is_error
    assert text_of(result) == final.text
    assert final.text.startswith("Done: ")
    assert (info.record.user_id, info.record.tenant) == ("alice", "acme")
    assert result.meta is not None
    assert result.meta["runbus/session_id"] == info.record.session_id
    assert "calling get_weather" in notes
    assert "get_weather answered" in notes
    assert steps == sorted(set(steps))  # progress only ever grows


async def test_a_session_id_continues_the_callers_own_conversation_only(
    served_mcp: Served, alice: RunbusClient
) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        first = await session.call_tool("travel", {"input": "Weather in Sydney?"})
        session_id = first.meta["runbus/session_id"] if first.meta else ""
        second = await session.call_tool(
            "travel", {"input": "And in Perth?", "session_id": session_id}
        )
    async with mcp_session(served_mcp.url, BOB) as bob:
        bobs = await bob.call_tool("travel", {"input": "Bob here", "session_id": session_id})
    loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
    said = [
        c.text
        for m in loaded.messages
        if m.role == "user"
        for c in m.contents
        if isinstance(c, TextContent)
    ]

    assert not first.is_error
    assert not second.is_error
    assert second.meta is not None
    assert second.meta["runbus/session_id"] == session_id
    assert said == ["Weather in Sydney?", "And in Perth?"]
    # Alice's session is no session of Bob's: his run fails as for a session that is not there.
    assert bobs.is_error
    assert text_of(bobs) == f"not_found: no session {session_id!r}"


async def test_a_failed_run_is_an_error_result_naming_its_error(served_mcp: Served) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        result = await session.call_tool("broken", {"input": "Say something"})

    assert result.is_error
    assert text_of(result).startswith("model_error: ")


async def test_a_run_waiting_for_approval_is_an_error_result_naming_the_run_and_call(
    served_mcp: Served, alice: RunbusClient
) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        result = await asyncio.wait_for(
            session.call_tool("booker", {"input": "Book QF412 in business"}), 20
        )
    run_id = run_id_of(result)
    info = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))

    assert result.is_error
    assert text_of(result).startswith(f"approval pending: run {run_id} ")
    assert result.meta is not None
    assert result.meta["runbus/call_id"] == "c-book"
    assert f"/v1/runs/{run_id}/approvals/c-book" in text_of(result)
    assert info.record.status == "waiting_approval"


async def test_an_unknown_tool_or_bad_arguments_are_invalid_params(served_mcp: Served) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        with pytest.raises(MCPError) as unknown:
            await session.call_tool("nobody", {"input": "Hi"})
        with pytest.raises(MCPError) as wildcard:
            await session.call_tool("travel.>", {"input": "Hi"})
        with pytest.raises(MCPError) as bad:
            await session.call_tool("travel", {"text": "Hi"})

    assert unknown.value.error.code == types.INVALID_PARAMS
    assert "nobody" in unknown.value.error.message
    assert wildcard.value.error.code == types.INVALID_PARAMS
    assert bad.value.error.code == types.INVALID_PARAMS


async def test_a_cancelled_call_cancels_its_run(served_mcp: Served, alice: RunbusClient) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        call = asyncio.create_task(session.call_tool("slow", {"input": "Weather?"}))
        await asyncio.wait_for(served_mcp.held.reached.wait(), 20)
        listed = await alice.call(ops.API_RUNS_LIST, RunList())
        (running,) = [r for r in listed.records if r.status == "running"]
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

        async def cancelled() -> bool:
            info = await alice.call(ops.API_RUNS_GET, RunGet(run_id=running.run_id))
            return info.record.status == "cancelled"

        await eventually(cancelled, timeout=20)
    served_mcp.held.release.set()


async def test_a_client_that_hangs_up_mid_call_cancels_its_run(
    served_mcp: Served, alice: RunbusClient
) -> None:
    headers = {
        **ALICE,
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "slow", "arguments": {"input": "Weather?"}},
    }
    async with aiohttp.ClientSession(headers=headers) as http:
        post = asyncio.create_task(http.post(served_mcp.url, json=call))
        await asyncio.wait_for(served_mcp.held.reached.wait(), 20)
        runs = await alice.call(ops.API_RUNS_LIST, RunList())
        (running,) = [r for r in runs.records if r.status == "running"]
        post.cancel()  # hangs up: the connection is dropped before the answer
        with pytest.raises(asyncio.CancelledError):
            await post

        async def cancelled() -> bool:
            info = await alice.call(ops.API_RUNS_GET, RunGet(run_id=running.run_id))
            return info.record.status == "cancelled"

        await eventually(cancelled, timeout=20)
    served_mcp.held.release.set()


async def test_without_a_valid_bearer_token_the_endpoint_answers_401(served_mcp: Served) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    statuses = []
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer not-a-token"}):
            async with http.post(served_mcp.url, json=body, headers=headers) as response:
                statuses.append(
                    (
                        response.status,
                        response.headers.get("WWW-Authenticate"),
                        (await response.json())["error"]["code"],
                    )
                )

    assert statuses == [(401, "Bearer", "unauthenticated")] * 2


async def test_a_body_that_is_no_json_rpc_message_is_a_typed_bad_request(
    served_mcp: Served,
) -> None:
    bodies = [b"{not json", b'{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', b"[]"]
    answers = []
    async with aiohttp.ClientSession(headers=ALICE) as http:
        for body in bodies:
            async with http.post(served_mcp.url, data=body) as response:
                answers.append((response.status, (await response.json())["error"]["code"]))

    assert answers == [(400, "bad_request")] * 3


async def test_another_tenants_user_sees_the_agents_they_may_run_and_runs_as_themselves(
    served_mcp: Served, alice: RunbusClient
) -> None:
    async with mcp_session(served_mcp.url, ALICE) as session:
        alices = await session.call_tool("travel", {"input": "Weather in Sydney?"})
    session_id = alices.meta["runbus/session_id"] if alices.meta else ""
    async with mcp_session(served_mcp.url, CAROL) as carol:
        listed = await carol.list_tools()
        result = await carol.call_tool("travel", {"input": "Carol here", "session_id": session_id})
    loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))

    assert {tool.name for tool in listed.tools} == set(AGENTS)
    assert not result.is_error
    with pytest.raises(RemoteError) as refused:
        await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id_of(result)))
    assert refused.value.known_code == "not_found"
    # The same session id is a session of Carol's own in her tenant: Alice's is untouched.
    assert "Carol here" not in [m.text for m in loaded.messages]
    assert len([m for m in loaded.messages if m.role == "user"]) == 1


@asynccontextmanager
async def modern_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    """The SDK's client on the 2026-07-28 envelope: `server/discover`, no handshake, each
    request on its own."""
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.discover()
        yield session


async def test_the_per_request_envelope_lists_calls_and_cancels_by_closing_the_call(
    served_mcp: Served, alice: RunbusClient
) -> None:
    async with modern_session(served_mcp.url, ALICE) as session:
        version = session.protocol_version
        listed = await session.list_tools()
        result = await session.call_tool("travel", {"input": "Weather in Sydney?"})
        call = asyncio.create_task(session.call_tool("slow", {"input": "Weather?"}))
        await asyncio.wait_for(served_mcp.held.reached.wait(), 20)
        runs = await alice.call(ops.API_RUNS_LIST, RunList())
        (running,) = [r for r in runs.records if r.status == "running"]
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

        async def cancelled() -> bool:
            info = await alice.call(ops.API_RUNS_GET, RunGet(run_id=running.run_id))
            return info.record.status == "cancelled"

        await eventually(cancelled, timeout=20)
    served_mcp.held.release.set()
    final = await completed(alice, run_id_of(result))

    assert version == "2026-07-28"
    assert {tool.name for tool in listed.tools} == set(AGENTS)
    assert text_of(result) == final.text


async def test_the_example_client_lists_the_tools_and_prints_the_answer_and_its_run(
    served_mcp: Served, alice: RunbusClient
) -> None:
    example = Path(__file__).parents[3] / "examples" / "mcp_agents.py"
    base = served_mcp.url.removesuffix("/v1/mcp")
    env = {**os.environ, "RUNBUS_HTTP_URL": base, "RUNBUS_TOKEN": "dev-alice"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(example),
        "Weather in Sydney?",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    lines = out.decode().splitlines()
    run_id = lines[-1].split()[1].rstrip(",")
    final = await completed(alice, run_id)

    assert process.returncode == 0, err.decode()
    assert lines[0] == "tools: " + ", ".join(sorted(AGENTS))
    assert "  … calling get_weather" in lines
    assert f"answer: {final.text}" in lines


async def test_another_users_cancel_naming_the_same_request_id_leaves_the_call_running(
    served_mcp: Served, alice: RunbusClient
) -> None:
    headers = {
        **BOB,
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    acknowledged = []
    async with mcp_session(served_mcp.url, ALICE) as session:
        call = asyncio.create_task(session.call_tool("slow", {"input": "Weather?"}))
        await asyncio.wait_for(served_mcp.held.reached.wait(), 20)
        with capture_logs() as logs:
            async with aiohttp.ClientSession(headers=headers) as http:
                for request_id in [*range(10), *map(str, range(10))]:
                    cancel = {
                        "jsonrpc": "2.0",
                        "method": "notifications/cancelled",
                        "params": {"requestId": request_id},
                    }
                    async with http.post(served_mcp.url, json=cancel) as response:
                        acknowledged.append(response.status)
        # Each 202 comes after its cancel was acted on: the call is let go only now.
        served_mcp.held.release.set()
        result = await asyncio.wait_for(call, 20)

    assert set(acknowledged) == {202}
    # Not even tried: the gateway would have refused, but Bob's ids never named Alice's run.
    assert not [e for e in logs if e["event"].startswith("mcp_run_cancel")]
    assert not result.is_error
    assert text_of(result) == (await completed(alice, run_id_of(result))).text
