"""`runbus status` and `runbus logs` as an operator runs them: against `runbus up` with three
tool executors, against a bare NATS, and against NATS that is not there."""

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.micro import add_service

from runbus import __version__
from runbus.commands.status import SERVICES
from runbus.settings import load_settings
from runbus.supervisor import ProcessStack
from tests.helpers import eventually
from tests.stack import SecuredNats

RUNBUS = str(Path(sys.executable).parent / "runbus")


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
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


def by_name(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {service["name"]: service for service in status["services"]}


@pytest.fixture(scope="module")
async def up(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, str]]:
    """`runbus up --replicas tool_executor=3` on a free port; yields the CLI's environment."""
    data_dir = tmp_path_factory.mktemp("up")
    env = {"RUNBUS_DATA_DIR": str(data_dir)}
    saved = dict(os.environ)
    os.environ.update(env)
    os.environ.pop("RUNBUS_NATS_URL", None)
    try:
        stack = ProcessStack(load_settings(), nats_port=0, replicas={"tool_executor": 3})
        await stack.start()
        try:
            yield env
        finally:
            await stack.stop()
    finally:
        os.environ.clear()
        os.environ.update(saved)


async def test_status_json_lists_three_ready_tool_executor_replicas_after_up_replicas(
    up: dict[str, str],
) -> None:
    code, out, err = await cli("status", "--json", env=up)

    assert code == 0, err
    services = by_name(json.loads(out))
    executor = services["tool_executor"]
    assert (executor["replicas"], executor["ready"]) == (3, 3)
    assert len({replica["id"] for replica in executor["instances"]}) == 3
    assert executor["versions"] == [__version__]
    for name in set(SERVICES) - {"tool_executor"}:
        assert services[name]["replicas"] == 1, name


async def test_status_sums_each_endpoints_requests_over_the_replicas(up: dict[str, str]) -> None:
    code, _, err = await cli(
        "run", "--session", "s-status", "Weather in Sydney, Perth and Hobart?", env=up
    )
    assert code == 0, err

    _, out, _ = await cli("status", "--json", env=up)

    executor = by_name(json.loads(out))["tool_executor"]
    endpoints = {e["name"]: e for e in executor["endpoints"]}
    weather = endpoints["invoke-get_weather"]
    assert weather["subject"] == "runbus.tools.get_weather.invoke"
    assert weather["queue_group"] == "tool_executor"
    assert weather["requests"] >= 3
    per_replica = [
        e["requests"]
        for replica in executor["instances"]
        for e in replica["endpoints"]
        if e["name"] == "invoke-get_weather"
    ]
    assert sum(per_replica) == weather["requests"]
    assert weather["average_ms"] > 0


async def test_status_table_shows_each_service_with_its_ready_replicas(up: dict[str, str]) -> None:
    code, out, err = await cli("status", env=up)

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("NATS nats://127.0.0.1:")
    rows = {line.split()[0]: line for line in lines[2:] if line and not line.startswith(" ")}
    assert set(SERVICES) <= set(rows)
    assert "3/3 ready" in rows["tool_executor"]
    assert "1/1 ready" in rows["history"]
    assert "runbus.history.load" in out


async def test_ping_exits_zero_for_a_running_service_and_one_for_an_absent_one(
    up: dict[str, str],
) -> None:
    ok, out, _ = await cli("status", "--ping", "tool_executor", env=up)
    absent, _, err = await cli("status", "--ping", "no_such_service", env=up)

    assert ok == 0
    assert "tool_executor: 3 replica(s) ready" in out
    assert absent == 1
    assert "no replica answers $SRV.PING.no_such_service" in err


async def test_logs_of_a_run_are_its_lines_from_every_service_in_time_order(
    up: dict[str, str],
) -> None:
    code, _, err = await cli("run", "--run-id", "r-logs-1", "Weather in Darwin?", env=up)
    assert code == 0, err

    async def both_logged() -> str:  # the supervisor writes the services' lines to files
        code, out, err = await cli("logs", "--json", "r-logs-1", env=up)
        assert code == 0, err
        return out if '"run_completed"' in out and '"run_started"' in out else ""

    out = await eventually(both_logged, 20)

    lines = [json.loads(line) for line in out.splitlines()]
    events = [line["event"] for line in lines if line.get("run_id") == "r-logs-1"]
    assert "run_started" in events
    assert "run_completed" in events
    [trace_id] = {line["trace_id"] for line in lines if line["event"] == "run_started"}
    assert all(line.get("run_id") == "r-logs-1" or line["trace_id"] == trace_id for line in lines)
    timestamps = [line["timestamp"] for line in lines]
    assert timestamps == sorted(timestamps)

    by_trace, trace_out, _ = await cli("logs", trace_id, env=up)
    assert by_trace == 0
    assert "run_completed" in trace_out


async def test_logs_exits_one_when_no_line_mentions_the_id(up: dict[str, str]) -> None:
    code, out, err = await cli("logs", "r-never-ran", env=up)

    assert code == 1
    assert out == ""
    assert "no line mentions 'r-never-ran'" in err


async def test_logs_reads_piped_lines_and_skips_what_is_not_json() -> None:
    lines = [
        "not json at all",
        json.dumps({"event": "b", "run_id": "r-p", "trace_id": "t1", "timestamp": "2"}),
        json.dumps({"event": "a", "trace_id": "t1", "timestamp": "1", "service": "history"}),
        json.dumps({"event": "other", "trace_id": "t2", "timestamp": "0"}),
    ]
    process = await asyncio.create_subprocess_exec(
        RUNBUS,
        "logs",
        "r-p",
        "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate("\n".join(lines).encode())

    assert process.returncode == 0
    assert [line.split()[2] for line in out.decode().splitlines()] == ["a", "b"]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_status_on_a_nats_with_only_its_auth_service_lists_the_six_as_missing_and_exits_one(
    nats_server: SecuredNats,
) -> None:
    # A cluster's URL list, one node of it down. The secured NATS runs its auth callout.
    urls = f"nats://127.0.0.1:{closed_port()},{nats_server.url}"

    code, out, _ = await cli("status", "--json", env={"RUNBUS_NATS_URL": urls})

    assert code == 1
    services = by_name(json.loads(out))
    assert services["auth"]["replicas"] == 1
    others = [name for name in SERVICES if name != "auth"]
    assert len(others) == 6
    assert [services[name]["replicas"] for name in others] == [0] * 6


async def test_status_says_nats_is_unreachable_and_exits_one_at_once() -> None:
    closed = closed_port()

    code, out, err = await asyncio.wait_for(
        cli("status", env={"RUNBUS_NATS_URL": f"nats://127.0.0.1:{closed}"}), 10
    )

    assert code == 1
    assert out == ""
    assert f"cannot reach NATS at nats://127.0.0.1:{closed}" in err


async def test_ping_local_counts_only_a_replica_that_runs_on_this_host(
    nats_server: SecuredNats,
) -> None:
    env = {"RUNBUS_NATS_URL": nats_server.url}
    nc = await nats.connect(nats_server.url)
    try:
        elsewhere = await add_service(
            nc, name="probe", version="1.0.0", metadata={"host": "another-host"}
        )
        remote_only, _, err = await cli("status", "--ping", "probe", "--local", env=env)
        anywhere, _, _ = await cli("status", "--ping", "probe", env=env)
        here = await add_service(
            nc, name="probe", version="1.0.0", metadata={"host": socket.gethostname()}
        )
        local, out, _ = await cli("status", "--ping", "probe", "--local", env=env)
        await here.stop()
        await elsewhere.stop()
    finally:
        await nc.drain()

    assert (remote_only, anywhere, local) == (1, 0, 0)
    assert f"no replica on {socket.gethostname()}" in err
    assert f"the replica on {socket.gethostname()} is ready" in out
