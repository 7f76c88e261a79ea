"""Pause, edit, resume through the whole stack: a run asked to pause stops at its next step
boundary (`paused`, its slot free), its owner reads the pending calls, edits them (checked
against the tool's schema) and resumes it; a paused run waits across a restart of every
service and of NATS."""

import asyncio
import re
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.cli import build_parser
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import (
    HistoryLoad,
    ModelRequest,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
)
from runbus.messages.runs import (
    CallEdit,
    RunCancel,
    RunEdit,
    RunGet,
    RunPause,
    RunPendingGet,
    RunResume,
)
from runbus.settings import load_settings
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.run.late import RESUME_WITHIN
from tests.helpers import eventually
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, Stack, secured_nats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")
GATEWAY = {"ack_wait": 1.0, "stop_grace": 0.2}


def weather_for(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    """First asks for Sydney's weather; then answers from the result and any note."""
    results = [r for m in request.messages for r in m.function_results]
    if not results:
        return call("get_weather", "c-weather", city="Sydney")
    result = results[-1]
    notes = [m.text for m in request.messages if m.message_id.split(":")[-1].startswith("note")]
    city = result.result["city"] if isinstance(result.result, dict) else result.error
    return text(f"Weather for {city}" + (f" ({'; '.join(notes)})" if notes else ""))


def stack(url: str, data_dir: Path, model: GatedModel) -> AbstractAsyncContextManager[Stack]:
    return start_stack(
        url, data_dir=data_dir, agents=AGENTS, routes={"gated": model}, gateway_options=GATEWAY
    )


async def paused(client: RunbusClient, run_id: str) -> RunPaused:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunPaused):
            return item.event
        assert not isinstance(item.event, RunCompleted | RunFailed), item.event
    raise AssertionError(f"run {run_id} did not pause")


async def final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


async def pause_at_the_first_reply(client: RunbusClient, model: GatedModel, session: str) -> str:
    """Start a run and ask it to pause while the model writes its first reply."""
    run_id = await client.start("travel", "Weather?", session_id=session)
    await asyncio.wait_for(model.reached.wait(), 10)
    await client.call(ops.API_RUNS_PAUSE, RunPause(run_id=run_id))
    model.release.set()
    return run_id


async def test_a_paused_run_shows_its_pending_call_takes_an_edit_and_resumes_with_it(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = GatedModel(weather_for, hold={0})
    async with stack(nats_server.url, tmp_path, model):
        run_id = await pause_at_the_first_reply(alice, model, "edit")
        event = await paused(alice, run_id)
        status = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record.status
        pending = await alice.call(ops.API_RUNS_PENDING, RunPendingGet(run_id=run_id))
        with pytest.raises(RemoteError) as bad:
            await alice.call(
                ops.API_RUNS_EDIT,
                RunEdit(run_id=run_id, replace=[CallEdit(call_id="c-weather", arguments={})]),
            )
        with pytest.raises(RemoteError) as unknown:
            await alice.call(ops.API_RUNS_EDIT, RunEdit(run_id=run_id, drop=["c-nothing"]))
        after_bad = await alice.call(ops.API_RUNS_PENDING, RunPendingGet(run_id=run_id))
        still = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record.status
        edited = await alice.call(
            ops.API_RUNS_EDIT,
            RunEdit(
                run_id=run_id,
                replace=[CallEdit(call_id="c-weather", arguments={"city": "Lisbon"})],
                add=["in Celsius please"],
            ),
        )
        await alice.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
        ended = await final(alice, run_id)
        events = [i.event async for i in alice.follow(run_id, timeout=20)]
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="edit"))

    assert [(c.name, c.arguments) for c in event.calls] == [("get_weather", {"city": "Sydney"})]
    assert status == "paused"
    assert pending.status == "paused"
    assert [c.arguments for c in pending.calls] == [{"city": "Sydney"}]
    assert [t.name for t in pending.tools] == ["get_weather"]
    assert bad.value.remote_code == "bad_request"
    assert "'city' is a required property" in bad.value.message
    assert unknown.value.remote_code == "bad_request"
    assert after_bad == pending  # a refused edit changes nothing
    assert still == "paused"
    assert [c.arguments for c in edited.calls] == [{"city": "Lisbon"}]
    assert isinstance(ended, RunCompleted)
    assert ended.text == "Weather for Lisbon (in Celsius please)"
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert [c.arguments for r in resumed for c in r.calls] == [{"city": "Lisbon"}]
    calls = [c for m in history.messages for c in m.function_calls]
    assert [(c.call_id, c.arguments) for c in calls] == [("c-weather", {"city": "Lisbon"})]
    roles = [(m.role, m.message_id.split(":")[-1]) for m in history.messages]
    assert roles == [
        ("user", "in0"),
        ("assistant", "m0"),
        ("tool", "t0"),
        ("user", "note1.0"),
        ("assistant", "m1"),
    ]
    assert len(model.requests) == 2  # the edit was not sent back to the model


async def test_dropping_every_pending_call_asks_the_model_again_with_the_added_message(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]

    def reconsider(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        notes = [m.text for m in request.messages if ":note" in m.message_id]
        if notes:
            return text(f"As you say: {notes[-1]}")
        return call("get_weather", "c-weather", city="Sydney")

    model = GatedModel(reconsider, hold={0})
    async with stack(nats_server.url, tmp_path, model):
        run_id = await pause_at_the_first_reply(alice, model, "drop")
        await paused(alice, run_id)
        await alice.call(
            ops.API_RUNS_EDIT,
            RunEdit(run_id=run_id, drop=["c-weather"], add=["never mind the weather"]),
        )
        await alice.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
        ended = await final(alice, run_id)
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="drop"))

    assert isinstance(ended, RunCompleted)
    assert ended.text == "As you say: never mind the weather"
    assert [c for m in history.messages for c in m.function_calls] == []
    assert [m.message_id.split(":")[-1] for m in history.messages] == ["in0", "note1.0", "m0"]


async def test_a_paused_run_waits_across_a_restart_of_every_service_and_of_nats(
    tmp_path: Path,
) -> None:
    model = GatedModel(weather_for, hold={0})
    async with secured_nats(tmp_path / "bus") as bus:
        alice = RunbusClient(await nats.connect(bus.url), token="dev-alice")
        async with stack(bus.url, tmp_path / "a", model):
            run_id = await pause_at_the_first_reply(alice, model, "restart")
            await paused(alice, run_id)
            await alice.call(
                ops.API_RUNS_EDIT,
                RunEdit(
                    run_id=run_id,
                    replace=[CallEdit(call_id="c-weather", arguments={"city": "Oslo"})],
                ),
            )
        await alice.nc.close()
    # NATS and every service are gone; the pause is in KV, the run's request unacked.
    async with secured_nats(tmp_path / "bus") as bus:
        alice = RunbusClient(await nats.connect(bus.url), token="dev-alice")
        async with stack(bus.url, tmp_path / "b", model):
            # Redelivered, the run reaches the same boundary and waits again, paused.
            again = await paused_again(alice, run_id)
            await alice.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
            ended = await final(alice, run_id)
            history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="restart"))
        await alice.nc.drain()

    assert again == "paused"
    assert isinstance(ended, RunCompleted)
    assert ended.text == "Weather for Oslo"
    assert len(model.requests) == 2  # the held reply was not asked for again
    calls = [c for m in history.messages for c in m.function_calls]
    assert [(c.call_id, c.arguments) for c in calls] == [("c-weather", {"city": "Oslo"})]


async def paused_again(client: RunbusClient, run_id: str) -> str:
    """The status once a redelivered run has taken its pause up again (its attempt counted)."""

    async def status() -> str:
        record = (await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
        return record.status if record.attempts > 1 and record.status == "paused" else ""

    return await eventually(status, 30, what="the redelivered run paused again")


async def test_the_cli_pauses_shows_edits_resumes_and_forks_a_run(
    nats_server: SecuredNats,
    tmp_path: Path,
    users: dict[str, RunbusClient],
    capsys: pytest.CaptureFixture[str],
) -> None:
    alice = users["alice"]
    settings = load_settings(
        {"RUNBUS_NATS_URL": nats_server.client_url, "RUNBUS_TOKEN": "dev-alice"}
    )

    async def cli(*argv: str) -> str:
        """What `runbus runs …` prints (the in-process services' log lines left out)."""
        capsys.readouterr()
        args = build_parser().parse_args(["runs", *argv])
        assert await args.handler(settings, args) == 0
        lines = capsys.readouterr().out.splitlines()
        return "\n".join(line for line in lines if not LOG_LINE.match(line))

    model = GatedModel(weather_for, hold={0})
    async with stack(nats_server.url, tmp_path, model):
        run_id = await alice.start("travel", "Weather?", session_id="cli")
        await asyncio.wait_for(model.reached.wait(), 10)
        asked = await cli("pause", run_id)
        model.release.set()
        await paused(alice, run_id)
        shown = await cli("pending", run_id)
        edited = await cli("edit", run_id, "--set", 'c-weather={"city": "Hobart"}', "--note", "hi")
        resumed = await cli("resume", run_id)
        ended = await final(alice, run_id)
        forked = await cli("fork", run_id, "--session", "cli-fork", "--checkpoint", "2")

    assert asked.startswith(f"run {run_id}: requested")
    assert 'call c-weather: get_weather {"city": "Sydney"}' in shown
    assert 'call c-weather: get_weather {"city": "Hobart"}' in edited
    assert "note: hi" in edited
    assert resumed.startswith(f"run {run_id}: resumed")
    assert isinstance(ended, RunCompleted)
    assert ended.text == "Weather for Hobart (hi)"
    assert forked.strip() == f"session cli-fork: 2 messages, from checkpoint 2 of 5 of run {run_id}"


async def test_a_paused_run_can_be_cancelled_and_its_pause_is_then_over(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = GatedModel(weather_for, hold={0})
    async with stack(nats_server.url, tmp_path, model):
        run_id = await pause_at_the_first_reply(alice, model, "cancel")
        await paused(alice, run_id)
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        ended = await final(alice, run_id)
        with pytest.raises(RemoteError) as late:
            await alice.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
        with pytest.raises(RemoteError) as again:
            await alice.call(ops.API_RUNS_PAUSE, RunPause(run_id=run_id))

    assert isinstance(ended, RunFailed)
    assert ended.error.code == "cancelled"
    assert late.value.remote_code == "conflict"
    assert "is not paused (cancelled)" in late.value.message
    assert again.value.remote_code == "conflict"
    assert len(model.requests) == 1  # its pending call never ran, the model was not asked again


async def test_a_run_resumed_near_its_deadline_goes_on_in_a_new_delivery_as_edited(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    """With a run timeout under `RESUME_WITHIN`, every resume finds too little time left: the
    run is delivered again, with a deadline of its own, and goes on from the pause."""
    alice = users["alice"]
    model = GatedModel(weather_for, hold={0})
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        gateway_options={**GATEWAY, "run_timeout": RESUME_WITHIN / 2},
    ):
        run_id = await pause_at_the_first_reply(alice, model, "late")
        await paused(alice, run_id)
        await alice.call(
            ops.API_RUNS_EDIT,
            RunEdit(
                run_id=run_id,
                replace=[CallEdit(call_id="c-weather", arguments={"city": "Perth"})],
                add=["briefly"],
            ),
        )
        await alice.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
        ended = await final(alice, run_id)
        record = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="late"))

    assert isinstance(ended, RunCompleted)
    assert ended.text == "Weather for Perth (briefly)"
    assert record.attempts == 2
    assert len(model.requests) == 2  # the held reply was not asked for again
    parts = [m.message_id.split(":")[-1] for m in history.messages]
    assert parts == ["in0", "m0", "t0", "note1.0", "m1"]
