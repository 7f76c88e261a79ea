"""`persist = true`: what compaction makes of the history is stored, so later runs load a
bounded history; the originals stay retrievable (audit) and travel with an export."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import HistoryLoad
from runbus.messages.history import HistoryLoaded
from runbus.messages.sessions import (
    SessionDelete,
    SessionExport,
    SessionImport,
)
from runbus_gateway.agents import load_agents
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, Stack, start_stack

PERSISTED = """
name = "windowed"
instructions = "You are a travel assistant."
model = "gated"
tools = ["get_weather"]

[compaction]
strategy = "sliding_window"
trigger = {condition = "turns_exceed", turns = 2}
persist = true
"""
RUNS = 6
PER_RUN = 4
"""Messages a run stores: the question, the weather call, its result, the answer."""


async def load(client: RunbusClient, session_id: str, *, originals: bool = False) -> HistoryLoaded:
    return await client.call(
        ops.HISTORY_LOAD,
        HistoryLoad(session_id=session_id, originals=originals),
    )


@asynccontextmanager
async def windowed_stack(
    nats_server: SecuredNats, tmp_path: Path, agent: str = PERSISTED
) -> AsyncIterator[tuple[Stack, RunbusClient, GatedModel]]:
    """The six services with the `windowed` agent defined by `agent` on a gated model, and
    alice's client."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "windowed.toml").write_text(agent)
    model = GatedModel(weather_then_answer)
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=load_agents(tmp_path / "agents"),
        routes={"gated": model},
    ) as stack:
        nc = await nats.connect(nats_server.url)
        yield stack, RunbusClient(nc, token="dev-alice"), model
        await nc.drain()


def test_persist_is_an_agents_compaction_key(tmp_path: Path) -> None:
    (tmp_path / "windowed.toml").write_text(PERSISTED)
    assert load_agents(tmp_path)["windowed"].compaction.persist
    (tmp_path / "windowed.toml").write_text(PERSISTED.replace("persist", "persisted"))
    with pytest.raises(Exception, match="persisted"):
        load_agents(tmp_path)


async def test_a_persisted_window_bounds_what_later_runs_load_and_the_originals_stay_for_audit(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    async with windowed_stack(nats_server, tmp_path) as (_, client, model):
        for n in range(RUNS):
            await client.run("windowed", f"Weather {n}?", session_id="w")
        loaded = await load(client, "w")
        audit = await load(client, "w", originals=True)

        exported = await client.call(ops.SESSIONS_EXPORT, SessionExport(session_id="w"))
        await client.call(ops.SESSIONS_DELETE, SessionDelete(session_id="w"))
        with pytest.raises(RemoteError, match="no session"):
            await load(client, "w")
        await client.call(ops.SESSIONS_IMPORT, SessionImport(document=exported.document))
        reloaded = await load(client, "w")
        reaudit = await load(client, "w", originals=True)
        again = await client.call(ops.SESSIONS_EXPORT, SessionExport(session_id="w"))

    # The model saw the window's last two turns ...
    assert [m.text for m in model.requests[-1].messages if m.role == "user"] == [
        f"Weather {n}?" for n in range(RUNS - 2, RUNS)
    ]
    # ... and history now loads what the window kept, not the whole session.
    assert loaded.compacted
    assert [m.text for m in loaded.messages if m.role == "user"] == [
        f"Weather {n}?" for n in range(RUNS - 2, RUNS)
    ]
    assert len(loaded.messages) == 2 * PER_RUN
    # Every original is still stored, in order, for audit.
    assert not audit.compacted
    assert [m.text for m in audit.messages if m.role == "user"] == [
        f"Weather {n}?" for n in range(RUNS)
    ]
    assert len(audit.messages) == RUNS * PER_RUN
    # Export carries originals and compactions; import restores both.
    assert exported.document.messages == audit.messages
    # One per run from the third on, when the window first moved.
    assert len(exported.document.compactions) == RUNS - 2
    assert reloaded == loaded
    assert reaudit == audit
    assert msgspec.json.encode(again.document) == msgspec.json.encode(exported.document)


async def test_without_persist_the_stored_history_stays_whole(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    prompt_copy_only = PERSISTED.replace("persist = true", "")
    async with windowed_stack(nats_server, tmp_path, prompt_copy_only) as (_, client, model):
        for n in range(4):
            await client.run("windowed", f"Weather {n}?", session_id="w")
        loaded = await load(client, "w")

    assert not loaded.compacted
    assert len(loaded.messages) == 4 * PER_RUN
    assert [m.text for m in model.requests[-1].messages if m.role == "user"] == [
        "Weather 2?",
        "Weather 3?",
    ]


async def test_a_run_goes_on_from_the_history_it_persisted_without_compacting_it_again(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    """Each run of a long session compacts once, at its first model call; its later steps go
    on from the compacted history it stored (as the next run will) and stay under the
    trigger, instead of a compaction hop and a `run.compacted` event at every step."""
    async with windowed_stack(nats_server, tmp_path) as (stack, client, model):
        compaction = stack.services["compaction"]
        for n in range(RUNS):
            await client.run("windowed", f"Weather {n}?", session_id="w")
        assert compaction._micro is not None
        served = sum(e.num_requests for e in compaction._micro.stats().endpoints)

    # Runs 3..6 start over the window (3 turns > 2); each compacts once.
    assert served == RUNS - 2
    # Both calls of the last run saw the window: the last two turns, nothing older.
    last_run = model.requests[-2:]
    for request in last_run:
        assert [m.text for m in request.messages if m.role == "user"] == [
            f"Weather {n}?" for n in range(RUNS - 2, RUNS)
        ]
