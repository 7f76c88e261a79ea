"""`runbus http` where no stack runs: it listens, says it is not ready, and answers every API
request 503 with the reason at once; a port already taken is one line, not a traceback."""

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

RUNBUS = str(Path(sys.executable).parent / "runbus")


def no_stack_env(data_dir: Path) -> dict[str, str]:
    env = {**os.environ, "RUNBUS_DATA_DIR": str(data_dir), "RUNBUS_LOG_FORMAT": "json"}
    env.pop("RUNBUS_NATS_URL", None)
    return env


@pytest.fixture
async def ingress(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """`runbus http --port 0` with no stack: its base URL and what it said before listening."""
    process = await asyncio.create_subprocess_exec(
        RUNBUS, "http", "--port", "0", env=no_stack_env(tmp_path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    said = ""
    try:
        async with asyncio.timeout(60):
            while True:
                line = (await process.stderr.readline()).decode()
                assert line, said
                if '"http_listening"' in line:
                    yield json.loads(line)["url"], said
                    break
                said += line
    finally:
        process.terminate()
        await process.wait()


async def test_with_no_stack_healthz_is_not_ready_and_requests_get_503_with_a_reason_at_once(
    ingress: tuple[str, str],
) -> None:
    base, said = ingress
    assert "no runbus stack is running here" in said
    headers = {"Authorization": "Bearer dev-alice"}
    async with aiohttp.ClientSession(base, headers=headers) as http:
        async with http.get("/healthz") as health:
            assert health.status == 503
        began = time.monotonic()
        async with http.post("/v1/runs", json={"agent": "travel", "text": "Hi"}) as run:
            body = await run.json()
        async with http.get("/v1/models") as models:
            openai_body = await models.json()

    assert time.monotonic() - began < 2
    assert run.status == models.status == 503
    [reason] = body["error"]["message"].splitlines()
    assert "no runbus stack answers" in reason
    assert "runbus up" in reason
    assert openai_body["error"]["code"] == "unavailable"


async def test_a_port_already_taken_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = await asyncio.create_subprocess_exec(
            RUNBUS, "http", "--port", str(port), env=no_stack_env(tmp_path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 1
    last = err.decode().strip().splitlines()[-1]
    assert last == (
        f"runbus http: cannot listen on 127.0.0.1:{port}: port {port} is taken (another "
        "`runbus http`?); choose one with --port"
    )
    assert "Traceback" not in err.decode()
