"""A service process stops when told to, even when its NATS server is gone: an orchestrator's
SIGTERM must end it (exit 0), not leave it reconnecting forever."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from runbus.embedded import EmbeddedNats
from runbus.errors import Unavailable
from runbus.runner import connect


async def _wait_for_line(stream: asyncio.StreamReader, needle: bytes, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while needle not in await stream.readline():
            pass


async def _service_until(
    module: str, url: str, data_dir: Path, line: bytes
) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader]:
    """`python -m <module>` on `url`, once its output says `line`; killed if it never does."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        env={**os.environ, "RUNBUS_NATS_URL": url, "RUNBUS_DATA_DIR": str(data_dir)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert process.stdout is not None
        await _wait_for_line(process.stdout, line, timeout=30)
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process, process.stdout


async def _sigterm(
    process: asyncio.subprocess.Process, stdout: asyncio.StreamReader
) -> tuple[int, bytes]:
    """SIGTERM, then the exit code and the rest of the output (killed after 15 s)."""
    process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(15):
            output = await stdout.read()
            return await process.wait(), output
    except TimeoutError:
        process.kill()
        await process.wait()
        raise


@pytest.mark.parametrize("module", ["runbus_gateway", "runbus_history"])
async def test_sigterm_stops_a_service_whose_nats_server_is_gone(
    module: str, tmp_path: Path
) -> None:
    with EmbeddedNats(tmp_path / "js") as server:
        process, stdout = await _service_until(module, server.url, tmp_path, b"service_started")
    await _wait_for_line(stdout, b"nats_disconnected", timeout=15)  # reconnecting now
    started = time.monotonic()
    code, output = await _sigterm(process, stdout)
    took = time.monotonic() - started

    assert code == 0, output.decode()[-2000:]
    assert b"service_stopped" in output
    assert b"Traceback" not in output
    assert took < 10


async def test_a_command_gives_up_on_an_unreachable_nats_with_a_clear_error(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(tmp_path / "js") as server:
        url = server.url
    # The server is gone: nothing listens on its port any more.
    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"no NATS server answered at .* within 0\.5 s"):
        await connect(url, "runbus-test", patience=0.5)

    assert time.monotonic() - started < 3


async def test_sigterm_stops_a_service_still_waiting_for_its_first_nats_connection(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(tmp_path / "js") as server:
        url = server.url  # nothing listens there any more
    process, stdout = await _service_until("runbus_history", url, tmp_path, b"connecting to NATS")
    code, output = await _sigterm(process, stdout)

    assert code == 0, output.decode()[-2000:]
    assert b"service_start_abandoned" in output
    assert b"Traceback" not in output
