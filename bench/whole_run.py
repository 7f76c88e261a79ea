"""Whole runs of the scripted travel agent through the deployment shape (bench/processes.py):
latency, CPU per run summed over every process, runs/s at 1/8/64 clients and 1/2 gateway
replicas, and a pyinstrument profile of the gateway process."""

import asyncio
import collections
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from pyinstrument.frame import Frame
from pyinstrument.renderers import ConsoleRenderer
from pyinstrument.session import Session

from bench.processes import Bench
from bench.timing import pct
from runbus.client import RunbusClient, RunFailedError, open_connection

TOKEN = "dev-alice"
_ids = itertools.count()


def stats_ms(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"p50_ms": statistics.median(ms), "p99_ms": pct(ms, 0.99), "n": len(ms)}


class Clients:
    """A few connections shared round-robin by the concurrent clients, so the client side
    is not one socket's queue."""

    def __init__(self, connections: list[NATS]) -> None:
        self.clients = [RunbusClient(nc, token=TOKEN) for nc in connections]
        self._next = itertools.cycle(self.clients)

    @classmethod
    async def open(cls, url: str, count: int = 4) -> "Clients":
        return cls([await open_connection(url, TOKEN) for _ in range(count)])

    async def close(self) -> None:
        for client in self.clients:
            await client.nc.drain()

    async def one(self, agent: str = "bench", session_id: str | None = None) -> float:
        """One whole run of the bench agent, start to `run.completed`, in seconds."""
        client = next(self._next)
        start = time.perf_counter()
        session_id = session_id or f"wr-{next(_ids)}"
        done = await client.run(agent, "Book it.", session_id=session_id)
        elapsed = time.perf_counter() - start
        assert "confirmation" in done.text, done.text
        return elapsed


async def warm(clients: Clients, runs: int = 20, tries: int = 50) -> None:
    """A few runs before measuring; while a service process is still opening (memory loads
    its embedder after it answers discovery), a run may fail `unavailable`: try again."""
    for attempt in range(tries):
        try:
            for _ in range(runs):
                await clients.one()
            return
        except RunFailedError as failed:
            if failed.remote_code != "unavailable" or attempt == tries - 1:
                raise
            await asyncio.sleep(0.2)


async def sequential(bench: Bench, clients: Clients, n: int) -> dict[str, Any]:
    """`n` runs one after another: latency and CPU per run of every process."""
    await warm(clients)
    before, client_cpu = bench.cpu(), time.process_time()
    samples = [await clients.one() for _ in range(n)]
    after, client_cpu = bench.cpu(), time.process_time() - client_cpu
    per_process = {k: (after[k] - before.get(k, 0.0)) * 1000 / n for k in after}
    services = sum(v for k, v in per_process.items() if k != "nats-server")
    return {
        **stats_ms(samples),
        "cpu_ms_per_run": {
            "services": services,
            "nats_server": per_process.get("nats-server", 0.0),
            "client": client_cpu * 1000 / n,
            "total": services + per_process.get("nats-server", 0.0) + client_cpu * 1000 / n,
            "by_process": per_process,
        },
    }


async def concurrent(clients: Clients, in_flight: int, total: int, trials: int) -> dict[str, Any]:
    """`trials` rounds of `total` runs, `in_flight` at a time: the median round's runs/s and
    the latency every run saw."""
    limit = asyncio.Semaphore(in_flight)
    samples: list[float] = []

    async def guarded() -> None:
        async with limit:
            samples.append(await clients.one())

    await asyncio.gather(*(guarded() for _ in range(min(total, in_flight * 2))))  # warm
    samples.clear()
    rates = []
    for _ in range(trials):
        start = time.perf_counter()
        await asyncio.gather(*(guarded() for _ in range(total)))
        rates.append(total / (time.perf_counter() - start))
    return {"runs_per_s": statistics.median(rates), "trials": rates, **stats_ms(samples)}


async def matrix(
    clients: Clients, levels: tuple[int, ...], runs: int, trials: int
) -> dict[str, dict[str, Any]]:
    points = {}
    for in_flight in levels:
        point = await concurrent(clients, in_flight, max(runs, in_flight * 4), trials)
        points[str(in_flight)] = point
        print(
            f"    {in_flight:>3} clients: {point['runs_per_s']:7.1f} runs/s   "
            f"p50 {point['p50_ms']:7.1f} ms   p99 {point['p99_ms']:7.1f} ms"
        )
    return points


async def profile(bench: Bench, clients: Clients, n: int, out: Path) -> dict[str, Any]:
    """Replace the gateways by one under pyinstrument; `n` sequential runs; its profile as a
    call tree (`out`) and the functions that took the most time themselves."""
    for process in list(bench.gateways):
        await bench.stop_gateway(process)
    session_file = bench.data / "gateway.pyisession"
    profiled = await bench.add_gateway(profile_to=session_file)
    samples = [await clients.one() for _ in range(n)]
    await bench.stop_gateway(profiled)
    session = Session.load(str(session_file))
    out.write_text(ConsoleRenderer(show_all=False, unicode=False, color=False).render(session))
    totals: collections.Counter[str] = collections.Counter()
    loop = find(session.root_frame(), "run", "asyncio/runners.py")
    if loop is not None:  # the service's life inside the event loop, not its imports
        self_times(loop, totals)
    top = [f"{seconds:7.3f} s  {name}" for name, seconds in totals.most_common(20)]
    return {
        "runs": n,
        "profile": out.name,
        "wall_s": session.duration,
        "cpu_s": session.cpu_time,
        "top_self_time": top,
        **stats_ms(samples),
    }


def find(frame: Frame | None, function: str, file_suffix: str) -> Frame | None:
    """The first frame, depth first, of `function` in a file ending with `file_suffix`."""
    if frame is None:
        return None
    if frame.function == function and frame.file_path_short.endswith(file_suffix):
        return frame
    for child in frame.children:
        if (found := find(child, function, file_suffix)) is not None:
            return found
    return None


def self_times(frame: Frame, totals: "collections.Counter[str]") -> None:
    """Add up each function's own time over the call tree (pyinstrument's flat view merges
    every `[self]` leaf into one row, which hides where the idle time is)."""
    if not frame.is_synthetic:
        where = f"{frame.function}  {frame.file_path_short}:{frame.line_no}"
        totals[where] += frame.total_self_time
    for child in frame.children:
        self_times(child, totals)
