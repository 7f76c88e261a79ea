"""An agent's `[compaction]` table drives what the model sees; history keeps everything."""

from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, RunCompacted
from runbus_gateway.agents import load_agents
from runbus_gateway.errors import GatewayConfigError
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, start_stack

SLIDING = """
name = "windowed"
instructions = "You are a travel assistant."
model = "gated"
tools = ["get_weather"]

[compaction]
strategy = "sliding_window"
trigger = {condition = "turns_exceed", turns = 2}
minimum_preserved = 2
"""


def test_an_unknown_compaction_key_stops_the_gateway_at_start(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text(SLIDING.replace("minimum_preserved", "minimum_kept"))
    with pytest.raises(GatewayConfigError, match="minimum_kept"):
        load_agents(tmp_path)


async def test_sliding_window_keeps_the_prompt_to_the_last_turns_while_history_keeps_all(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "windowed.toml").write_text(SLIDING)
    agents = load_agents(tmp_path / "agents")
    model = GatedModel(weather_then_answer)
    url = nats_server.url
    async with start_stack(url, data_dir=tmp_path, agents=agents, routes={"gated": model}):
        nc = await nats.connect(url)
        client = RunbusClient(nc, token="dev-alice")
        compacted: list[RunCompacted] = []
        for n in range(4):
            async for event in client.stream("windowed", f"Weather {n}?", session_id="w"):
                if isinstance(event, RunCompacted):
                    compacted.append(event)
        loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="w"))
        await nc.drain()

    last_prompt = model.requests[-1].messages
    assert [m.text for m in last_prompt if m.role == "user"] == ["Weather 2?", "Weather 3?"]
    assert len(loaded.messages) == 16
    assert compacted
    assert compacted[-1].report.strategy == "sliding_window"
    assert compacted[-1].report.excluded_message_ids
    assert msgspec.json.encode(compacted[-1])  # the event round-trips on the wire
