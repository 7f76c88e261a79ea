"""Tool calls inside whole runs on the six services: the model cannot pick who a booking is for,
bad arguments and hung tools become results the model sees, and the run finishes."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_examples.travel import tools as travel
from runbus_gateway.agents import AgentSpec
from runbus_tool_executor.registry import ToolRegistry
from tests.helpers import publish_and_collect, raw_request
from tests.stack import SecuredNats, Stack, start_stack

slow = ToolRegistry()


@slow.tool(timeout=0.5)
async def sleep_forever() -> str:
    """A tool that never answers."""
    await asyncio.Event().wait()
    return "never"


AGENT = AgentSpec(
    name="travel",
    instructions="Book what you are told.",
    model="scripted/tools",
    tools=["create_booking", "get_weather", "sleep_forever"],
    max_iterations=4,
)
SCRIPT = [
    ScriptedReply(
        tool_calls=[
            ScriptedCall("create_booking", {"flight_id": "QF431-20260310", "user_id": "mallory"}),
            ScriptedCall("get_weather", {"city": "../../etc/passwd"}),
            ScriptedCall("sleep_forever"),
        ]
    ),
    ScriptedReply(text="Done."),
]


@pytest.fixture
async def tool_stack(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Stack]:
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents={"travel": AGENT},
        scripts={"tools": SCRIPT},
        tool_registries=[travel, slow],
    ) as running:
        yield running


async def test_a_run_books_for_its_user_and_reports_bad_and_hung_calls_then_finishes(
    tool_stack: Stack, nc: NATS
) -> None:
    events = await publish_and_collect(
        nc, "r-tools", raw_request("r-tools", "Book QF431 for mallory"), token="dev-alice"
    )

    assert events[-1]["type"] == "run.completed"
    results = {
        e["result"]["call_id"]: e["result"] for e in events if e["type"] == "run.tool_result"
    }
    booking, weather, hung = (results[f"call-0-{i}"] for i in range(3))
    assert booking["result"]["passenger"] == "alice"
    assert booking["result"]["tenant"] == "acme"
    assert weather["error"].startswith("invalid arguments")
    assert "city" in weather["error"]
    assert hung["error"] == "tool 'sleep_forever' timed out after 0.5s."
    assert events[-1]["text"] == "Done."
