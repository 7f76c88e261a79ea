"""A second stack on a data dir in use says so in one line and touches nothing: the running
stack keeps its NATS config, its URL file and its clients."""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runbus import busauth
from runbus.runner import URL_FILE
from runbus.settings import load_settings
from runbus.supervisor import ProcessStack

RUNBUS = str(Path(sys.executable).parent / "runbus")


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    """The environment of a stack running on `tmp_path`."""
    env = {**os.environ, "RUNBUS_DATA_DIR": str(tmp_path)}
    env.pop("RUNBUS_NATS_URL", None)
    stack = ProcessStack(load_settings(env), nats_port=0)
    await stack.start()
    try:
        yield env
    finally:
        await stack.stop()


async def command(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        RUNBUS, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("second", [("up",), ("demo",)])
async def test_a_second_stack_in_the_same_data_dir_names_the_first_and_changes_nothing(
    running: dict[str, str], tmp_path: Path, second: tuple[str, ...]
) -> None:
    env = running
    config = busauth.secrets_dir(tmp_path) / busauth.SERVER_CONFIG_FILE
    before = (config.read_bytes(), config.stat().st_mtime_ns, (tmp_path / URL_FILE).read_text())

    code, _, err = await command(env, *second)

    assert code == 1
    [line] = err.strip().splitlines()
    assert f"a stack is already running here ({tmp_path}), pid {os.getpid()}" in line
    after = (config.read_bytes(), config.stat().st_mtime_ns, (tmp_path / URL_FILE).read_text())
    assert after == before
    code, out, err = await command(env, "sessions", "list")
    assert code == 0, err
    assert out.startswith("SESSION")
