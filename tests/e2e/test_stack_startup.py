"""`ProcessStack` (what `runbus up` and the e2e fixtures run) starts by progress: slow is fine,
stuck or dead is named with its last step, and a failed start leaves no process behind. Log
files are JSON lines whatever a service writes, and a 300 KiB line blocks nobody."""

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from runbus.embedded import EmbeddedNats
from runbus.messages.progress import ServiceProgress
from runbus.settings import load_settings
from runbus.supervisor import (
    SERVICES,
    ProcessStack,
    Replica,
    ServiceExited,
    ServiceStalled,
    StartTimedOut,
)
from tests.e2e.loud_tools import LOUD_LINE_BYTES

REPO = Path(__file__).resolve().parents[2]
RUNBUS = str(Path(sys.executable).parent / "runbus")


def running(pid: int) -> bool:
    """A runbus service process with this pid still exists (not even as a zombie)."""
    try:
        return b"runbus_" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def nats_refuses(url: str) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def test_a_service_that_fails_to_start_stops_everything_the_start_started(
    tmp_path: Path,
) -> None:
    # memory cannot start: the openai embedder has no URL. The others are starting.
    stack = ProcessStack(
        load_settings({"RUNBUS_DATA_DIR": str(tmp_path)}),
        nats_port=0,
        replica_env={"memory": {"RUNBUS_EMBEDDER": "openai"}},
    )

    with pytest.raises(ServiceExited) as failed:
        await stack.start()

    assert failed.value.label == "memory"
    assert "RUNBUS_EMBEDDINGS_URL" in str(failed.value)
    assert "asking the embeddings server for its vector size" in str(failed.value)
    assert len(stack.spawned) == len(SERVICES)  # the auth service and the six
    assert [pid for pid in stack.spawned if running(pid)] == []
    assert await nats_refuses(stack.url)
    assert not (tmp_path / "nats.url").exists()


async def test_a_service_that_crashes_before_it_logs_is_named_with_its_last_words(
    tmp_path: Path,
) -> None:
    stack = ProcessStack(
        load_settings({"RUNBUS_DATA_DIR": str(tmp_path)}),
        services=("history",),
        nats_port=0,
        replica_env={"history": {"RUNBUS_HSTORY_MAX_AGE": "60"}},
    )

    with pytest.raises(ServiceExited) as failed:
        await stack.start()

    assert failed.value.code == 2
    assert "RUNBUS_HSTORY_MAX_AGE: unknown variable (typo?)" in str(failed.value)
    assert [pid for pid in stack.spawned if running(pid)] == []


async def test_a_service_that_stops_making_progress_is_named_with_its_last_step(
    tmp_path: Path,
) -> None:
    steps: list[str] = []

    def freeze_at_first_report(replica: Replica, report: ServiceProgress) -> None:
        if not steps:
            os.kill(replica.process.pid, signal.SIGSTOP)
        steps.append(report.step)

    stack = ProcessStack(
        load_settings({"RUNBUS_DATA_DIR": str(tmp_path)}),
        services=("history",),
        nats_port=0,
        on_progress=freeze_at_first_report,
    )

    with pytest.raises(ServiceStalled) as stalled:
        await stack.start(stall_after=3)

    assert stalled.value.label == "history"
    # The last step it had reported when it froze (reports it had queued arrive only once
    # the stop wakes it up to end it).
    assert stalled.value.step in steps
    assert f"at step {stalled.value.step!r}" in str(stalled.value)
    assert [pid for pid in stack.spawned if running(pid)] == []


async def test_a_service_waiting_for_qdrant_says_so_and_runbus_status_shows_why(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(tmp_path / "gone") as gone:
        port = gone.url.rsplit(":", 1)[1]
    qdrant = f"http://127.0.0.1:{port}"  # nothing listens there any more
    waiting = asyncio.Event()

    def on_progress(replica: Replica, report: ServiceProgress) -> None:
        if report.state == "waiting":
            waiting.set()

    stack = ProcessStack(
        load_settings({"RUNBUS_DATA_DIR": str(tmp_path)}),
        services=("memory",),
        nats_port=0,
        replica_env={"memory": {"RUNBUS_QDRANT_URL": qdrant}},
        on_progress=on_progress,
    )
    starting = asyncio.ensure_future(stack.start())
    try:
        async with asyncio.timeout(60):
            await asyncio.wait(
                {starting, asyncio.ensure_future(waiting.wait())},
                return_when=asyncio.FIRST_COMPLETED,
            )
        assert waiting.is_set(), starting
        status = await asyncio.create_subprocess_exec(
            RUNBUS,
            "status",
            env={**os.environ, "RUNBUS_NATS_URL": stack.url, "RUNBUS_DATA_DIR": str(tmp_path)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await status.communicate()
    finally:
        # What Ctrl-C on `runbus up` does: the start is cancelled and stops what it started.
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting

    text = out.decode()
    assert status.returncode == 1, err.decode()
    assert f"memory ({socket.gethostname()}:{stack.pid('memory')}) not ready" in text
    assert f"Qdrant at {qdrant} (RUNBUS_QDRANT_URL)" in text
    assert [pid for pid in stack.spawned if running(pid)] == []


@pytest.mark.slow
async def test_with_a_timeout_a_start_that_waits_on_a_dependency_gives_up_naming_it(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(tmp_path / "gone") as gone:
        port = gone.url.rsplit(":", 1)[1]
    stack = ProcessStack(
        load_settings({"RUNBUS_DATA_DIR": str(tmp_path)}),
        services=("history", "memory"),
        nats_port=0,
        replica_env={"memory": {"RUNBUS_QDRANT_URL": f"http://127.0.0.1:{port}"}},
    )

    with pytest.raises(StartTimedOut) as timed_out:
        await stack.start(timeout=20)

    assert str(timed_out.value).startswith("not ready after 20 s (--timeout): memory (")
    assert [r.split(" ")[0] for r in timed_out.value.waiting] == ["memory"]
    assert [pid for pid in stack.spawned if running(pid)] == []


@pytest.fixture(scope="module")
async def quiet_memory_and_loud_tools(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ProcessStack]:
    data_dir = tmp_path_factory.mktemp("startup")
    loud = {
        "PYTHONPATH": str(REPO),
        "RUNBUS_TOOL_MODULES": "runbus_examples.travel,tests.e2e.loud_tools",
    }
    stack = ProcessStack(
        load_settings({"RUNBUS_DATA_DIR": str(data_dir)}),
        services=("memory", "tool_executor"),
        nats_port=0,
        replica_env={"tool_executor": loud},
    )
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()


async def test_memory_is_ready_without_its_embedder_and_stays_small_while_unused(
    quiet_memory_and_loud_tools: ProcessStack,
) -> None:
    stack = quiet_memory_and_loud_tools
    log = (stack.data / "logs" / "memory.log").read_text()

    assert "service_started" in log
    assert "embedder_loading" not in log
    assert rss_mib(stack.pid("memory")) < 120


async def test_a_300_kib_output_line_is_logged_as_json_and_blocks_nobody(
    quiet_memory_and_loud_tools: ProcessStack,
) -> None:
    stack = quiet_memory_and_loud_tools
    lines = (stack.data / "logs" / "tool_executor.log").read_bytes().splitlines()
    fields = [msgspec.json.decode(line) for line in lines]  # every line is JSON

    [loud] = [f for f in fields if f.get("event") == "output"]
    assert loud["text"] == "x" * LOUD_LINE_BYTES
    events = [f.get("event") for f in fields]
    assert events.index("output") < events.index("service_started")
