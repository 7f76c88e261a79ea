"""Ctrl-C on `runbus up` as a terminal sends it: SIGINT to the whole foreground process
group. Every service drains to the end (one signal, from `runbus up`, never a second that
cuts the drain short), then NATS stops; no traceback, no process left."""

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from runbus.supervisor import SERVICES
from tests.e2e.test_cli_messages import processes_of

RUNBUS = str(Path(sys.executable).parent / "runbus")


async def test_ctrl_c_in_the_terminal_lets_every_service_drain_and_prints_no_traceback(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "RUNBUS_DATA_DIR": str(tmp_path), "RUNBUS_LOG_LEVEL": "info"}
    env.pop("RUNBUS_NATS_URL", None)
    # Its own process group, as a shell gives a foreground job: the group is what ^C signals.
    up = await asyncio.create_subprocess_exec(
        RUNBUS, "up", env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    assert up.stdout is not None
    said = b""
    async with asyncio.timeout(120):
        while b"Ctrl-C to stop" not in said:
            line = await up.stdout.readline()
            assert line, said.decode()
            said += line

    os.killpg(up.pid, signal.SIGINT)
    rest, _ = await asyncio.wait_for(up.communicate(), 60)
    said += rest

    assert up.returncode == 0, said.decode()
    assert b"Traceback" not in said
    assert said.decode().rstrip().endswith("runbus: stopped")
    assert processes_of(tmp_path) == []
    for service in SERVICES:
        events = [
            json.loads(line)["event"]
            for line in (tmp_path / "logs" / f"{service}.log").read_text().splitlines()
            if line.startswith("{")
        ]
        assert "service_stop_cut_short" not in events, service
        assert events.count("service_stopping") == 1, service
        assert "service_stopped" in events, service
