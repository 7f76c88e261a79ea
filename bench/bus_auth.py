"""What per-user NATS identities cost: connection setup (p50) with the auth callout against a
plain connection to an open bus, and a run's cost (wall p50, CPU of this process plus
nats-server) before (open bus, a JetStream consumer per followed run) and after (secured bus,
a plain subscription per run), measured side by side in one run.

    uv run --locked python -m bench.bus_auth [--connects 200] [--runs 40] [--rounds 3]
"""

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path

import nats
import uvloop
from nats.aio.client import Client as NATS
from tests.stack import secured_nats, start_stack

from runbus import busauth
from runbus.client import RunbusClient, new_run_id, open_connection
from runbus.embedded import EmbeddedNats
from runbus.messages import RunCompleted, RunFailed
from runbus.tokens import TokenVerifier
from runbus_auth.service import AuthService

Connect = Callable[[], Awaitable[NATS]]


def _server_cpu(pid: int) -> float:
    """CPU seconds nats-server `pid` has used (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def _bus(secured: bool, root: Path) -> AsyncIterator[tuple[str, str, Connect, int]]:
    """(services' URL, a client connect, nats-server pid) of an open or a secured bus."""
    if secured:
        async with secured_nats(root) as bus:
            assert bus.server._process is not None
            pid = bus.server._process.pid

            async def token_client() -> NATS:
                return await open_connection(bus.client_url, "dev-alice")

            yield bus.url, bus.client_url, token_client, pid
    else:
        with EmbeddedNats(root / "jetstream") as server:
            assert server._process is not None
            # An open bus still has the auth service: clients ask it who they are.
            auth_nc = await nats.connect(server.url)
            seed = busauth.StackSecrets.load_or_create(root).issuer_seed
            auth = AuthService(auth_nc, verifier=TokenVerifier.from_file(), issuer_seed=seed)
            await auth.start()

            async def plain_client() -> NATS:
                return await nats.connect(server.url)

            try:
                yield server.url, server.url, plain_client, server._process.pid
            finally:
                await auth.stop()
                await auth_nc.drain()


async def _connects(connect: Connect, count: int) -> float:
    took = []
    for _ in range(count):
        started = time.perf_counter()
        nc = await connect()
        took.append(time.perf_counter() - started)
        await nc.close()
    return statistics.median(took) * 1000


async def _consumer_run(client: RunbusClient, session_id: str) -> None:
    """A run followed as the client did before: a JetStream consumer per followed run,
    made before the request is published."""
    run_id = new_run_id()
    subscription = await client._subscribe(run_id, 0)
    await client.start("travel", "Weather in Sydney?", session_id=session_id, run_id=run_id)
    async with aclosing(client._events(run_id, subscription, 60.0)) as events:
        async for item in events:
            if isinstance(item.event, RunCompleted | RunFailed):
                return


async def _runs(
    url: str, connect: Connect, pid: int, root: Path, count: int, *, consumer: bool = False
) -> tuple[float, float]:
    """(wall p50 ms, CPU ms per run of this process and nats-server) over `count` runs."""
    async with start_stack(url, data_dir=root / "data"):
        nc = await connect()
        client = RunbusClient(nc, token="dev-alice")
        await client.run("travel", "Weather in Sydney?", session_id="warm")
        took = []
        cpu_before = time.process_time() + _server_cpu(pid)
        for index in range(count):
            started = time.perf_counter()
            if consumer:
                await _consumer_run(client, f"s{index}")
            else:
                await client.run("travel", "Weather in Sydney?", session_id=f"s{index}")
            took.append(time.perf_counter() - started)
        cpu = time.process_time() + _server_cpu(pid) - cpu_before
        await nc.drain()
    return statistics.median(took) * 1000, cpu / count * 1000


async def main(connects: int, runs: int, rounds: int) -> None:
    # before: an open bus, a consumer per followed run; after: the secured bus, a plain
    # subscription per run (and the open bus with it, to tell the two changes apart).
    variants = {"before": (False, True), "open+sub": (False, False), "after": (True, False)}
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (secured, consumer) in variants.items():
            with tempfile.TemporaryDirectory(prefix=f"bench-auth-{name}-") as folder:
                root = Path(folder)
                async with _bus(secured, root) as (url, _, connect, pid):
                    setup = await _connects(connect, connects)
                    wall, cpu = await _runs(url, connect, pid, root, runs, consumer=consumer)
                results[name].append((setup, wall, cpu))
    medians = {
        name: [statistics.median(row[i] for row in rows) for i in range(3)]
        for name, rows in results.items()
    }
    print(f"rounds={rounds} connects={connects} runs={runs} (medians of rounds)")
    print(f"{'variant':<9} {'connect p50 ms':>15} {'run p50 ms':>11} {'CPU ms/run':>11}")
    for name, (setup, wall, cpu) in medians.items():
        print(f"{name:<9} {setup:>15.2f} {wall:>11.1f} {cpu:>11.1f}")
    (o_setup, o_wall, o_cpu), (s_setup, s_wall, s_cpu) = medians["before"], medians["after"]
    print(
        f"ratio after/before: connect {s_setup / o_setup:.2f}x, run p50 {s_wall / o_wall:.3f}, "
        f"CPU per run {s_cpu / o_cpu:.3f} (limit 1.05)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connects", type=int, default=200)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    uvloop.run(main(args.connects, args.runs, args.rounds))
