"""Time travel: any run forks from any of its checkpoints into a new session whose transcript is
the original's up to there, byte for byte, and goes on from there on its own."""

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import ChatMessage, ModelRequest, RunCompleted, RunFailed
from runbus.messages.runs import RunFork
from runbus.messages.sessions import SessionExport
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


def weather_then_answer(request: ModelRequest, step: int) -> ChatMessage:
    """A call for the weather of the last user message's city, then an answer from its result."""
    if step == 0:
        city = [m.text for m in request.messages if m.role == "user"][-1]
        return call("get_weather", f"c-{city.lower()}", city=city)
    result = [r for m in request.messages for r in m.function_results][-1]
    seen = sum(1 for m in request.messages if m.role == "user")
    return text(f"{result.result['city']}: {result.result['conditions']} ({seen} questions)")


@pytest.fixture
async def alice(nats_server: SecuredNats) -> AsyncIterator[RunbusClient]:
    client = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    yield client
    await client.nc.drain()


async def finished(client: RunbusClient, run_id: str) -> RunCompleted:
    async for item in client.follow(run_id, timeout=20):
        assert not isinstance(item.event, RunFailed), item.event
        if isinstance(item.event, RunCompleted):
            return item.event
    raise AssertionError("no final event")


async def history(client: RunbusClient, session_id: str) -> list[ChatMessage]:
    """The session's messages as stored (a load would add a placeholder result to a call left
    without one)."""
    exported = await client.call(ops.SESSIONS_EXPORT, SessionExport(session_id=session_id))
    return exported.document.messages


async def test_a_fork_from_each_checkpoint_replays_the_transcript_up_to_it_byte_for_byte(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer)
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        first = await alice.start("travel", "Paris", session_id="trip")
        await finished(alice, first)
        second = await alice.start("travel", "Rome", session_id="trip")
        await finished(alice, second)
        original = await history(alice, "trip")
        forks = []
        for checkpoint in range(5):
            forked = await alice.call(
                ops.API_RUNS_FORK,
                RunFork(run_id=second, session_id=f"trip-{checkpoint}", checkpoint=checkpoint),
            )
            forks.append((forked, await history(alice, f"trip-{checkpoint}")))
        with pytest.raises(RemoteError) as past_the_end:
            await alice.call(
                ops.API_RUNS_FORK, RunFork(run_id=second, session_id="trip-9", checkpoint=9)
            )
        with pytest.raises(RemoteError) as taken:
            await alice.call(ops.API_RUNS_FORK, RunFork(run_id=second, session_id="trip"))
        # The fork at the model's call goes on its own way: a new question after it.
        onward = await alice.start("travel", "Oslo", session_id="trip-0")
        answer = await finished(alice, onward)
        after = await history(alice, "trip")

    ids = [m.message_id.removeprefix(f"{second}:") for m in original[4:]]
    assert ids == ["in0", "m0", "t0", "m1"]
    checkpoints = forks[0][0].checkpoints
    assert [(c.checkpoint, c.message_id.split(":")[-1]) for c in checkpoints] == [
        (1, "in0"),
        (2, "m0"),
        (3, "t0"),
        (4, "m1"),
    ]
    for checkpoint, (forked, messages) in enumerate(forks):
        kept = original[: 4 + checkpoint]
        assert (forked.checkpoint, forked.messages) == (checkpoint, len(kept))
        assert msgspec.json.encode(messages) == msgspec.json.encode(kept)
    assert past_the_end.value.remote_code == "bad_request"
    assert "checkpoints 0 to 4" in past_the_end.value.message
    assert taken.value.remote_code == "conflict"
    # trip-0 held the first run only: the model saw two questions, Paris and Oslo.
    assert answer.text.endswith("(2 questions)")
    assert answer.text.startswith("Oslo")
    assert after == original  # the original session is untouched
