"""The whole stack as a user runs it: `runbus` processes on an embedded nats-server, spans
exported over real OTLP/HTTP, the CLI as a subprocess."""

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from runbus.settings import load_settings
from runbus.supervisor import ProcessStack
from tests.helpers import eventually, publish_and_collect, raw_request, types
from tests.otlp_receiver import OtlpReceiver, otlp_receiver
from tests.stack import SERVICE_NAMES, service_url

RUNBUS = str(Path(sys.executable).parent / "runbus")


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
async def process_stack(
    receiver: tuple[OtlpReceiver, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ProcessStack]:
    data_dir = tmp_path_factory.mktemp("stack")
    saved = dict(os.environ)
    os.environ.update(
        {
            "RUNBUS_DATA_DIR": str(data_dir),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver[1],
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
    )
    os.environ.pop("RUNBUS_NATS_URL", None)
    try:
        stack = ProcessStack(load_settings(), nats_port=0)
        await stack.start()
        try:
            yield stack
        finally:
            await stack.stop()
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
async def client(process_stack: ProcessStack) -> AsyncIterator[NATS]:
    nc = await nats.connect(service_url(process_stack.url, process_stack.data))
    yield nc
    await nc.drain()


async def test_raw_request_from_plain_nats_py_completes_across_six_processes(
    client: NATS,
) -> None:
    events = await publish_and_collect(client, "r-e2e", raw_request("r-e2e", "Weather in Perth?"))

    assert types(events)[0] == "run.started"
    assert types(events)[-1] == "run.completed"
    [result] = [e["result"]["result"] for e in events if e["type"] == "run.tool_result"]
    assert f"{result['temperature_c']}°C" in events[-1]["text"]


HOPPED = set(SERVICE_NAMES) - {"compaction"}
"""The services a short run reaches: its prompt stays under the compaction trigger."""


async def test_run_is_one_trace_in_the_otlp_receiver_across_every_service_it_reaches(
    client: NATS, receiver: tuple[OtlpReceiver, str]
) -> None:
    events = await publish_and_collect(
        client, "r-otlp", raw_request("r-otlp", "Book me a flight from Perth to Darwin tomorrow")
    )
    assert types(events)[-1] == "run.completed"

    def whole_trace() -> list:  # type: ignore[type-arg]
        roots = [s for s in receiver[0].snapshot() if s.attributes.get("runbus.run_id") == "r-otlp"]
        if not roots:
            return []
        spans = [s for s in receiver[0].snapshot() if s.trace_id == roots[0].trace_id]
        complete = {s.service for s in spans} == HOPPED
        # Each process exports its spans in batches of its own, and a parent ends after its
        # children (the run's root after the ack), so it may come in a later batch: the trace
        # is whole once it has its root and every parent it names.
        ids = {s.span_id for s in spans}
        parented = all(not s.parent_span_id or s.parent_span_id in ids for s in spans)
        rooted = any(not s.parent_span_id for s in spans)
        return spans if complete and rooted and parented else []

    spans = await eventually(whole_trace, 15, what="the run's whole trace (no orphan spans)")

    assert {s.service for s in spans} == HOPPED
    ids = {s.span_id for s in spans}
    orphans = [s.name for s in spans if s.parent_span_id and s.parent_span_id not in ids]
    assert orphans == []
    assert [s.name for s in spans if not s.parent_span_id] == ["process runbus.runs.{agent}"]


async def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        RUNBUS,
        *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_cli_run_prints_the_answer_and_exits_zero(process_stack: ProcessStack) -> None:
    code, out, err = await _cli(
        "run", "--agent", "travel", "--session", "s1", "What's the weather in Sydney?"
    )

    assert code == 0, err
    assert "→ get_weather" in out
    assert "°C" in out
    assert "Sydney" in out


async def test_cli_run_exits_non_zero_with_the_reason_on_a_failed_run(
    process_stack: ProcessStack,
) -> None:
    code, out, _ = await _cli("run", "--agent", "nope", "Weather?")

    assert code == 1
    assert "unknown_agent" in out


async def test_cli_with_a_token_the_bus_refuses_says_so_in_one_line(
    process_stack: ProcessStack,
) -> None:
    code, out, err = await _cli("run", "Weather?", env={"RUNBUS_TOKEN": "not-a-token"})

    assert code == 1
    assert out == ""
    [line] = err.strip().splitlines()
    assert "refused the token" in line
    assert "RUNBUS_TOKEN" in line


async def test_cli_run_json_prints_one_event_per_line(process_stack: ProcessStack) -> None:
    code, out, err = await _cli("run", "--json", "--session", "s2", "Weather in Tokyo?")

    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith('{"type":"run.started"')
    assert lines[-1].startswith('{"type":"run.completed"')


async def test_cli_shows_sessions_history_and_runs_of_the_caller_only(
    process_stack: ProcessStack,
) -> None:
    code, _, err = await _cli("run", "--session", "cli-s", "Weather in Cairns?")
    assert code == 0, err

    code, out, err = await _cli("sessions", "list", "--json")
    assert code == 0, err
    assert "cli-s" in {s["session_id"] for s in json.loads(out)}
    code, out, _ = await _cli("sessions", "list", "--json", env={"RUNBUS_TOKEN": "dev-bob"})
    assert "cli-s" not in {s["session_id"] for s in json.loads(out)}

    code, out, err = await _cli("history", "cli-s")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("[user     ] Weather in Cairns?")
    assert "→ get_weather" in lines[1]
    assert lines[2].startswith("[tool     ] ←")

    code, out, err = await _cli("runs", "list", "--session", "cli-s", "--json")
    assert code == 0, err
    [run] = json.loads(out)
    assert run["status"] == "completed"
    code, out, _ = await _cli("runs", "follow", run["run_id"])
    assert "assistant:" in out


async def test_cli_export_delete_import_restores_a_session(
    process_stack: ProcessStack, tmp_path: Path
) -> None:
    code, _, err = await _cli("run", "--session", "cli-x", "Weather in Darwin?")
    assert code == 0, err
    code, exported, err = await _cli("sessions", "export", "cli-x")
    assert code == 0, err
    document = tmp_path / "cli-x.json"
    document.write_text(exported)

    code, _, err = await _cli("sessions", "delete", "cli-x")
    assert code == 0, err
    code, _, err = await _cli("history", "cli-x")
    assert code == 1
    assert "not_found" in err or "no session" in err
    code, _, err = await _cli("sessions", "import", str(document))
    assert code == 0, err
    code, again, _ = await _cli("sessions", "export", "cli-x")
    assert again == exported
