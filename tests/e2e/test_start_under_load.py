"""Start-up under load: with every core held by a busy loop, `runbus up` and the e2e stack
fixture's `ProcessStack` still become ready, because they wait on progress, not a clock."""

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from runbus.settings import load_settings
from runbus.supervisor import SERVICES, ProcessStack

RUNBUS = str(Path(sys.executable).parent / "runbus")
CORES = 2
"""Busy loops started: both cores of the machine this was written for (more is not needed
to prove the point, and fewer would leave a core free)."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@asynccontextmanager
async def busy_cores() -> AsyncIterator[None]:
    loops = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
        for _ in range(CORES)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            await loop.wait()


async def test_runbus_up_becomes_ready_with_both_cores_busy(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNBUS_", "OTEL_"))}
    env["RUNBUS_DATA_DIR"] = str(tmp_path)
    async with busy_cores():
        began = time.monotonic()
        up = await asyncio.create_subprocess_exec(
            RUNBUS, "up", "--quiet", env=env, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert up.stderr is not None
        said = b""
        try:
            while b"runbus: up:" not in said:
                line = await up.stderr.readline()
                assert line, said.decode()
                said += line
            took = time.monotonic() - began
        finally:
            up.send_signal(signal.SIGINT)
            await up.communicate()
    print(f"runbus up ready under load in {took:.1f} s")
    assert up.returncode == 0
    assert b"Traceback" not in said


async def test_the_e2e_stack_fixture_becomes_ready_with_both_cores_busy(tmp_path: Path) -> None:
    stack = ProcessStack(load_settings({"RUNBUS_DATA_DIR": str(tmp_path)}), nats_port=0)
    async with busy_cores():
        began = time.monotonic()
        await stack.start()
        took = time.monotonic() - began
        await stack.stop()
    print(f"ProcessStack ready under load in {took:.1f} s")
    assert len(stack.spawned) == len(SERVICES)
