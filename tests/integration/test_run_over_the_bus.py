"""A run request published with plain nats-py crosses all six services and comes back as
events; history keeps what the run said, once."""

import pytest
from nats.aio.client import Client as NATS

from runbus import ops
from runbus.bus import Bus
from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages import HistoryLoad
from tests.helpers import publish_and_collect, raw_request, types
from tests.stack import Stack


async def test_raw_json_run_request_streams_events_and_answers_with_the_tool_result(
    stack: Stack, nc: NATS
) -> None:
    events = await publish_and_collect(nc, "r-7f3a", raw_request("r-7f3a", "Weather in Sydney?"))

    assert types(events)[0] == "run.started"
    assert types(events)[-1] == "run.completed"
    assert "run.tool_call" in types(events)
    assert "run.text_delta" in types(events)
    [result] = [e["result"] for e in events if e["type"] == "run.tool_result"]
    weather = result["result"]
    completed = events[-1]
    assert f"{weather['temperature_c']}°C" in completed["text"]
    assert weather["conditions"] in completed["text"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "run.text_delta")
    assert deltas == completed["text"]


async def test_second_run_sees_the_first_in_history_and_nothing_is_stored_twice(
    stack: Stack, nc: NATS
) -> None:
    await publish_and_collect(nc, "r-one", raw_request("r-one", "Weather in Perth?"))
    await publish_and_collect(nc, "r-two", raw_request("r-two", "Weather in Hobart?"))

    bus = Bus(nc, stack.providers["gateway"].get_tracer("test"))
    ctx = RunContext(session_id="s1", props={"tenant": "acme", "user_id": "alice"})
    loaded = await bus.call(ops.HISTORY_LOAD, HistoryLoad(session_id="s1"), ctx=ctx)
    ids = [m.message_id for m in loaded.messages]
    assert len(ids) == len(set(ids))
    # user, assistant (tool call), tool, assistant (answer) — per run, in order.
    assert [m.role for m in loaded.messages] == ["user", "assistant", "tool", "assistant"] * 2
    assert all(m.source == "chat_history" for m in loaded.messages)
    assert "Perth" in loaded.messages[0].text
    assert "Hobart" in loaded.messages[4].text


async def test_republished_run_request_runs_once(stack: Stack, nc: NATS) -> None:
    body = raw_request("r-twice", "Weather in Tokyo?")
    first = await publish_and_collect(nc, "r-twice", body)
    ack = await nc.jetstream().publish(
        "runbus.runs.travel",
        body,
        headers={"Nats-Msg-Id": "r-twice", "rb-auth": "Bearer dev-alice"},
    )
    assert types(first)[-1] == "run.completed"
    assert ack.duplicate


@pytest.mark.parametrize(
    ("tenant", "user_id"), [("globex", "carol"), ("acme", "bob"), ("globex", "alice")]
)
async def test_history_of_a_session_is_invisible_to_anyone_but_its_owner(
    stack: Stack, nc: NATS, tenant: str, user_id: str
) -> None:
    await publish_and_collect(nc, "r-acme", raw_request("r-acme", "Weather in Perth?"))
    bus = Bus(nc, stack.providers["gateway"].get_tracer("test"))
    other = RunContext(session_id="s1", props={"tenant": tenant, "user_id": user_id})
    with pytest.raises(RemoteError) as raised:
        await bus.call(
            ops.HISTORY_LOAD,
            HistoryLoad(session_id="s1"),
            ctx=other,
        )
    assert raised.value.remote_code == "not_found"
    assert raised.value.message == "no session 's1'"
