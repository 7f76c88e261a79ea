"""Sessions of any length: on a bus with a 64 KiB max payload (so the limit is reached in a few
dozen turns instead of hundreds), a session without persisted compaction stays usable, loads
a bounded window, and is read for audit, exported and imported in pages."""

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import busauth, ops
from runbus.client import RunbusClient, RunFailedError
from runbus.commands.sessions import (
    export_pages,
    history_pages,
    import_parts,
    write_document,
)
from runbus.embedded import EmbeddedNats
from runbus.errors import RemoteError
from runbus.messages import ChatMessage, HistoryLoad, ModelRequest
from runbus.messages.sessions import (
    SessionDelete,
    SessionDocument,
    SessionExport,
    SessionGet,
    SessionImport,
    SessionList,
    SessionStateUpdate,
)
from runbus_gateway.agents import load_agents
from tests.models import GatedModel, text
from tests.stack import SecuredNats, Stack, answering_the_callout, start_stack

MAX_PAYLOAD = 64 * 1024
HALF_TURN = 1500
"""Bytes of a question and of an answer: 3 KB turns, as in the issue's measurement."""
TURNS = 60
"""180 KB of history: almost three times the bus's max payload."""

AGENT = """
name = "chatty"
instructions = "You answer at length."
model = "gated"
"""


def long_answer(request: ModelRequest, step: int) -> ChatMessage:
    asked = [m.text for m in request.messages if m.role == "user"][-1]
    return text(f"answer to {asked[:13]} " + "a" * HALF_TURN)


def question(n: int) -> str:
    return f"question {n:04d} " + "q" * HALF_TURN


@asynccontextmanager
async def small_bus(data_dir: Path, max_payload: int = MAX_PAYLOAD) -> AsyncIterator[SecuredNats]:
    """`runbus up`'s secured bus, with a small max payload."""
    secrets = busauth.StackSecrets.load_or_create(data_dir)
    config = busauth.write_server_config(data_dir, secrets)
    config.write_text(config.read_text() + f"\nmax_payload: {max_payload}\n")
    with EmbeddedNats(data_dir / "jetstream", config_file=config) as server:
        async with answering_the_callout(server.url, secrets) as auth:
            yield SecuredNats(server=server, secrets=secrets, auth=auth, client_url=server.url)


@asynccontextmanager
async def chatty_stack(tmp_path: Path) -> AsyncIterator[tuple[Stack, RunbusClient, GatedModel]]:
    """The six services on the small bus with an agent that has no compaction at all."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "chatty.toml").write_text(AGENT)
    model = GatedModel(long_answer)
    async with (
        small_bus(tmp_path / "bus") as bus,
        start_stack(
            bus.url,
            data_dir=tmp_path / "data",
            agents=load_agents(tmp_path / "agents"),
            routes={"gated": model},
        ) as stack,
    ):
        nc = await nats.connect(bus.url)
        assert nc.max_payload == MAX_PAYLOAD
        yield stack, RunbusClient(nc, token="dev-alice"), model
        await nc.drain()


def user_texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text for m in messages if m.role == "user"]


async def test_a_session_past_the_bus_limit_stays_usable_and_each_run_loads_a_bounded_window(
    tmp_path: Path,
) -> None:
    async with chatty_stack(tmp_path) as (_, client, model):
        for n in range(TURNS):
            done = await client.run("chatty", question(n), session_id="long")
            assert done.text.startswith(f"answer to question {n:04d}")
        loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="long"))
        record = (await client.call(ops.SESSIONS_GET, SessionGet(session_id="long"))).record

    prompts = [len(msgspec.json.encode(r.messages)) for r in model.requests]
    # The whole session is far past what one message on this bus can carry ...
    assert TURNS * 2 * HALF_TURN > 2 * MAX_PAYLOAD
    # ... yet no prompt ever grew past a quarter of it: history loads a window of the last
    # whole turns, and the last run saw its own question last.
    assert max(prompts) < MAX_PAYLOAD // 4 + 4 * HALF_TURN
    last = user_texts(model.requests[-1].messages)
    assert last[-1] == question(TURNS - 1)
    assert last == [question(n) for n in range(TURNS - len(last), TURNS)]
    assert loaded.compacted
    window = user_texts(loaded.messages)
    assert window == [question(n) for n in range(TURNS - len(window), TURNS)]
    assert record.active_run is None


async def test_an_audit_read_of_a_long_session_comes_in_pages_and_a_whole_read_is_refused_at_once(
    tmp_path: Path,
) -> None:
    async with chatty_stack(tmp_path) as (_, client, _model):
        for n in range(TURNS):
            await client.run("chatty", question(n), session_id="long")
        pages = [m async for m in history_pages(client, "long", originals=True)]
        window = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="long"))
        paged_window = [m async for p in history_pages(client, "long", originals=False) for m in p]
        with pytest.raises(RemoteError) as refused:
            await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="long", originals=True))
        with pytest.raises(RemoteError) as export_refused:
            await client.call(ops.SESSIONS_EXPORT, SessionExport(session_id="long"))

    assert len(pages) > 2
    audit = [m for page in pages for m in page]
    assert user_texts(audit) == [question(n) for n in range(TURNS)]
    assert len(audit) == 2 * TURNS
    # Read in pages, the history a run loads is the same as in one reply.
    assert paged_window == window.messages
    assert refused.value.known_code == "message_too_large"
    assert "pages" in refused.value.message
    assert export_refused.value.known_code == "message_too_large"


async def test_a_long_session_exported_in_pages_is_imported_in_parts_whole(
    tmp_path: Path,
) -> None:
    async with chatty_stack(tmp_path) as (_, client, _model):
        for n in range(TURNS):
            await client.run("chatty", question(n), session_id="long")
        out = io.BytesIO()
        await write_document(export_pages(client, "long"), out)
        document = msgspec.json.decode(out.getvalue(), type=SessionDocument)
        window = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="long"))
        await client.call(ops.SESSIONS_DELETE, SessionDelete(session_id="long"))

        record = await import_parts(client, document, MAX_PAYLOAD)
        audit = [m async for page in history_pages(client, "long", originals=True) for m in page]
        reloaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="long"))
        again = io.BytesIO()
        await write_document(export_pages(client, "long"), again)
        # And the imported session goes on.
        await client.run("chatty", question(TURNS), session_id="long")

    assert len(out.getvalue()) > 2 * MAX_PAYLOAD
    assert user_texts(document.messages) == [question(n) for n in range(TURNS)]
    assert document.compactions, "the windows history stored travel with it"
    assert audit == document.messages
    assert reloaded.messages == window.messages
    assert again.getvalue() == out.getvalue()
    assert record.active_run is None


async def test_a_session_being_imported_in_parts_is_busy_until_its_last_part(
    tmp_path: Path,
) -> None:
    async with chatty_stack(tmp_path) as (_, client, _model):
        for n in range(3):
            await client.run("chatty", question(n), session_id="short")
        exported = await client.call(ops.SESSIONS_EXPORT, SessionExport(session_id="short"))
        await client.call(ops.SESSIONS_DELETE, SessionDelete(session_id="short"))
        document = exported.document
        first = msgspec.structs.replace(document, messages=document.messages[:2])
        rest = msgspec.structs.replace(document, messages=document.messages[2:])

        started = await client.call(ops.SESSIONS_IMPORT, SessionImport(document=first, more=True))
        with pytest.raises(RunFailedError) as busy:
            await client.run("chatty", question(9), session_id="short")
        finished = await client.call(
            ops.SESSIONS_IMPORT,
            SessionImport(document=rest, part_of=started.record.incarnation),
        )
        await client.run("chatty", question(3), session_id="short")
        loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="short"))

    assert busy.value.known_code == "session_busy"
    assert started.record.active_run is not None
    assert finished.record.active_run is None
    assert user_texts(loaded.messages) == [question(n) for n in range(4)]


@pytest.mark.slow
async def test_a_thousand_turn_session_on_the_default_bus_stays_usable_and_reads_whole_in_pages(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "chatty.toml").write_text(AGENT)
    model = GatedModel(long_answer)
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=load_agents(tmp_path / "agents"),
        routes={"gated": model},
    ):
        nc = await nats.connect(nats_server.url)
        client = RunbusClient(nc, token="dev-alice")
        for n in range(1000):
            await client.run("chatty", question(n), session_id="long")
        audit = [m async for page in history_pages(client, "long", originals=True) for m in page]
        limit = nc.max_payload
        await nc.drain()

    assert limit * 2 < 1000 * 2 * HALF_TURN, "the session is far past what one message carries"
    assert max(len(msgspec.json.encode(r.messages)) for r in model.requests) < limit // 4
    assert user_texts(audit) == [question(n) for n in range(1000)]


async def test_a_listing_too_large_for_one_reply_says_some_were_left_out(
    tmp_path: Path,
) -> None:
    async with chatty_stack(tmp_path) as (_, client, _model):
        for n in range(8):
            await client.run("chatty", question(n), session_id=f"s{n}")
            await client.call(
                ops.SESSIONS_STATE_UPDATE,
                SessionStateUpdate(session_id=f"s{n}", key="notes", value="n" * 10_000),
            )
        listed = await client.call(ops.SESSIONS_LIST, SessionList(limit=8))
        few = await client.call(ops.SESSIONS_LIST, SessionList(limit=2))

    assert 0 < len(listed.records) < 8
    assert listed.more
    assert [r.session_id for r in listed.records] == [
        f"s{n}" for n in range(7, 7 - len(listed.records), -1)
    ]
    assert len(few.records) == 2
    assert not few.more
