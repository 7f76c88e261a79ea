"""Whole runs of the scripted travel agent through the deployment shape (bench/processes.py):
latency, CPU per run summed over every process, runs/s at 1/8/64 clients and 1/2 gateway
replicas, and the messages a run puts on the bus (the gateway's profile: bench/profile.py)."""

import asyncio
import collections
import itertools
import statistics
import time
from collections.abc import Callable

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bench.processes import Bench, service_login
from bench.results import BusMessages, Latency, ProcessCpu, SequentialRun, ThroughputPoint
from bench.timing import pct
from runbus import subjects
from runbus.client import RunbusClient, RunFailedError, open_connection

TOKEN = "dev-alice"
_ids = itertools.count()


def stats_ms(samples_s: list[float]) -> Latency:
    ms = [s * 1000 for s in samples_s]
    return Latency(p50_ms=statistics.median(ms), p99_ms=pct(ms, 0.99), n=len(ms))


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


async def sequential(bench: Bench, clients: Clients, n: int) -> SequentialRun:
    """`n` runs one after another: latency and CPU per run of every process."""
    await warm(clients)
    before, client_cpu = bench.cpu(), time.process_time()
    samples = [await clients.one() for _ in range(n)]
    after, client_cpu = bench.cpu(), time.process_time() - client_cpu
    per_process = {k: (after[k] - before.get(k, 0.0)) * 1000 / n for k in after}
    services = sum(v for k, v in per_process.items() if k != "nats-server")
    latency = stats_ms(samples)
    return SequentialRun(
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
        n=latency.n,
        cpu_ms_per_run=ProcessCpu(
            services=services,
            nats_server=per_process.get("nats-server", 0.0),
            client=client_cpu * 1000 / n,
            total=services + per_process.get("nats-server", 0.0) + client_cpu * 1000 / n,
            by_process=per_process,
        ),
    )


BUS_KINDS = (
    "run requests",
    "request/reply hops",
    "history stream writes",
    "KV writes",
    "replies",
    "run events",
    "JetStream API",
    "JetStream acks",
    "other",
)
"""What a message on the services' account is, by its subject (see `bus_kind`)."""


def bus_kind(msg: Msg) -> str:
    """Which of BUS_KINDS a message seen on the services' account is."""
    subject = msg.subject
    if subject.startswith(subjects.RUNS_ALL[:-1]):
        return "run requests"
    if subject.startswith(subjects.EVENTS_ALL[:-1]):
        return "run events"
    if subject.startswith("$JS.API."):
        return "JetStream API"
    if subject.startswith("$JS.ACK."):
        return "JetStream acks"
    if subject.startswith(subjects.HISTORY_LOG_ALL[:-1]):
        return "history stream writes"
    if subject.startswith("$KV."):
        return "KV writes"
    if subject.startswith(f"{subjects.PREFIX}.") and msg.reply:
        return "request/reply hops"
    if subject.startswith(("_INBOX", subjects.SERVICE_INBOX_PREFIX)):
        return "replies"
    return "other"


async def bus_messages(bench: Bench, clients: Clients, n: int) -> BusMessages:
    """Messages per run on the services' account, by kind (BUS_KINDS) and by subject, seen by
    a subscription to every subject with the service credential over `n` sequential runs.
    Counted in runs of their own: the subscriber's copies would add to the timed runs' CPU."""
    monitor = await nats.connect(bench.url, **service_login(bench.data))
    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    async def count(msg: Msg) -> None:
        kind = bus_kind(msg)
        # Hops by subject; KV writes and "other" by the subject's first two tokens (the
        # bucket); the rest by kind.
        name = msg.subject if kind == "request/reply hops" else kind
        if kind in ("KV writes", "other"):
            name = ".".join(msg.subject.split(".")[:2]) + ".…"
        seen[kind, name] += 1

    try:
        sub = await monitor.subscribe(">", cb=count)
        await monitor.flush()
        before = await last_sequences(monitor)
        for _ in range(n):
            await clients.one()
        await monitor.flush()
        await asyncio.sleep(0.5)  # the last run's acks and replies trail its final event
        await sub.unsubscribe()
        after = await last_sequences(monitor)
    finally:
        await monitor.close()
    by_kind = dict.fromkeys(BUS_KINDS, 0.0)
    hops = {name: times / n for (kind, name), times in seen.most_common() if kind == BUS_KINDS[1]}
    other = {
        name: times / n
        for (kind, name), times in seen.most_common()
        if kind in ("KV writes", "other")
    }
    for (kind, _), times in seen.items():
        by_kind[kind] += times / n
    stored = {
        name: (seq - before.get(name, 0)) / n
        for name, seq in sorted(after.items())
        if seq != before.get(name, 0)
    }
    return BusMessages(
        runs=n,
        by_kind=by_kind,
        hops_by_subject=hops,
        kv_and_other_by_subject=other,
        stored_by_stream=stored,
    )


async def last_sequences(nc: NATS) -> dict[str, int]:
    """Every stream's last sequence: what it has stored so far, deletions or not."""
    streams = await nc.jetstream().streams_info()
    return {info.config.name or "": info.state.last_seq for info in streams}


async def concurrent(
    clients: Clients,
    in_flight: int,
    total: int,
    trials: int,
    cpu_seconds: Callable[[], float] | None = None,
) -> ThroughputPoint:
    """`trials` rounds of `total` runs, `in_flight` at a time: the median round's runs/s and
    the latency every run saw; with `cpu_seconds` (every process's CPU so far, the client's
    included), the CPU per run over the rounds."""
    limit = asyncio.Semaphore(in_flight)
    samples: list[float] = []

    async def guarded() -> None:
        async with limit:
            samples.append(await clients.one())

    await asyncio.gather(*(guarded() for _ in range(min(total, in_flight * 2))))  # warm
    samples.clear()
    rates = []
    cpu = cpu_seconds() if cpu_seconds else 0.0
    for _ in range(trials):
        start = time.perf_counter()
        await asyncio.gather(*(guarded() for _ in range(total)))
        rates.append(total / (time.perf_counter() - start))
    latency = stats_ms(samples)
    return ThroughputPoint(
        runs_per_s=statistics.median(rates),
        trials=rates,
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
        n=latency.n,
        cpu_ms_per_run=((cpu_seconds() - cpu) * 1000 / (total * trials) if cpu_seconds else None),
    )


async def matrix(
    clients: Clients,
    levels: tuple[int, ...],
    runs: int,
    trials: int,
    cpu_seconds: Callable[[], float] | None = None,
) -> dict[str, ThroughputPoint]:
    points = {}
    for in_flight in levels:
        point = await concurrent(clients, in_flight, max(runs, in_flight * 4), trials, cpu_seconds)
        points[str(in_flight)] = point
        cpu = (
            f"   CPU {point.cpu_ms_per_run:.2f} ms/run" if point.cpu_ms_per_run is not None else ""
        )
        print(
            f"    {in_flight:>3} clients: {point.runs_per_s:7.1f} runs/s   "
            f"p50 {point.p50_ms:7.1f} ms   p99 {point.p99_ms:7.1f} ms{cpu}"
        )
    return points
