"""NATS restart: the single embedded node (JetStream on file storage) stopped in the
middle of a load of runs and started again on the same port and store; every service
reconnects on its own and every run completes once, nothing repeated, nothing lost."""

import asyncio
import socket
import time
from pathlib import Path

from runbus import busauth
from runbus.client import connect
from runbus.embedded import EmbeddedNats
from tests.chaos.conftest import ChaosReport, chaos_size
from tests.chaos.processes import (
    TOKEN,
    USER,
    Load,
    chaos_stack,
    count,
    disrupt_at,
    kill_points,
    settled,
    where,
)
from tests.helpers import take_time

RUNS = chaos_size(8, 100)
IN_FLIGHT = chaos_size(4, 8)
SETTLE = 60.0
"""Seconds the run queue gets to empty after the last final event (a lost ack costs the
gateway's 30 s ack wait)."""
RESTARTS = chaos_size(1, 3)
DOWN_FOR = 1.0
"""Seconds the server stays down: several reconnect attempts (every 0.5 s) fail first."""
LOAD_TIMEOUT = chaos_size(120.0, 900.0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_nats_restart_mid_load_services_reconnect_and_every_run_completes_once(
    tmp_path: Path, chaos_report: ChaosReport
) -> None:
    # The same secured bus as `runbus up` (secrets in the stack's data dir, where its processes
    # find their credentials), on a fixed port so the restarted server is where every client
    # reconnects.
    data = tmp_path / "stack"
    data.mkdir()
    config = busauth.write_server_config(data, busauth.StackSecrets.load_or_create(data))
    server = EmbeddedNats(
        tmp_path / "jetstream",
        port=_free_port(),
        log_file=tmp_path / "nats.log",
        config_file=config,
    )
    url = server.start()
    try:
        async with chaos_stack(data, replicas={}, nats_url=url) as chaos:
            load = Load(chaos, prefix="nats", runs=RUNS, in_flight=IN_FLIGHT)
            points = kill_points(RUNS, RESTARTS)
            outages: list[float] = []

            async def restart() -> None:
                down = time.monotonic()
                await asyncio.to_thread(server.stop)
                await take_time(DOWN_FOR)  # the outage
                await asyncio.to_thread(server.start)
                outages.append(time.monotonic() - down)

            started = time.monotonic()
            restarts = asyncio.create_task(disrupt_at(load, points, restart))
            await load.run(timeout=LOAD_TIMEOUT)
            in_flight = await restarts
            counts = await count(chaos, load.run_ids, unsettled=await settled(chaos, SETTLE))
            # Every service is back: each answers discovery on the restarted server; the auth
            # service (in an account of its own, out of discovery) admits a new client.
            for service in chaos.stack.services:
                if service == "auth":
                    async with connect(url, token=TOKEN) as client:
                        assert (await client.identity()).user_id == USER
                else:
                    await chaos.nc.request(f"$SRV.PING.{service}", b"", timeout=5)
    finally:
        server.stop()

    chaos_report.record(
        "NATS restart",
        {
            "restarts": len(outages),
            "at run # (in flight)": where(points, in_flight),
            "down s (each)": ", ".join(f"{o:.1f}" for o in outages),
            **counts.row(),
            "wall s": round(time.monotonic() - started, 1),
        },
    )
    assert counts.problems() == dict.fromkeys(counts.problems(), 0), counts
