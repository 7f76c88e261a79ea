"""Memory benchmark: embedding 100 sentences (MiniLM int8 vs the hashing embedder); a search
filtered by user in the embedded qdrant-edge shard at 1k / 10k / 100k memories, next to the
unfiltered search of the same shard and qdrant-client's local mode at 1k / 10k; stores through
the service (request/reply and the JetStream writes stream) next to raw shard upserts. Every
comparison is measured in the same run."""

import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import nats
import numpy as np
from opentelemetry import trace

from bench.timing import timed
from runbus import ops, subjects
from runbus.bus import Bus
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.messages import encode
from runbus.messages.memory import MemoryStore
from runbus.service import ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_memory.core import MemoryRecord, StorageScope, memory_id
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import Embedder, HashingEmbedder
from runbus_memory.minilm import MiniLMEmbedder
from runbus_memory.qdrant import QdrantClientStore
from runbus_memory.service import MemoryService
from runbus_memory.stores import MemoryStore as Store

DIMENSION = 384
SIZES = (1_000, 10_000, 100_000)
LOCAL_MODE_SIZES = (1_000, 10_000)
USERS = 1_000
"""Memories are spread over this many users in 10 tenants: 100 per user at 100k."""
SENTENCES = [
    f"Sentence {n}: the traveller prefers {kind} seats and flights leaving {when}."
    for n, (kind, when) in enumerate(
        (k, w)
        for k in ("window", "aisle", "front-row", "exit-row", "quiet")
        for w in ("early", "late", "on weekdays", "at weekends")
        for _ in range(5)
    )
]


def _p(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"p50 {statistics.median(ms):8.3f} ms  p99 {ms[int(0.99 * (len(ms) - 1))]:8.3f} ms"


def _scope(i: int) -> StorageScope:
    user = i % USERS
    return StorageScope(
        tenant=f"t{user % 10}", user_id=f"u{user}", session_id=f"s{i % 5000}", agent_id="travel"
    )


def _unit(rng: np.random.Generator, rows: int) -> list[list[float]]:
    vectors = rng.standard_normal((rows, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    result: list[list[float]] = vectors.tolist()
    return result


async def _fill(store: Store, start: int, stop: int, rng: np.random.Generator) -> None:
    now = datetime.now(UTC)
    for first in range(start, stop, 2000):
        last = min(first + 2000, stop)
        records = [
            MemoryRecord(memory_id(_scope(i), f"fact {i}"), f"fact {i}", _scope(i), now)
            for i in range(first, last)
        ]
        await store.upsert(records, _unit(rng, last - first))


async def _embedding() -> None:
    print("\n[memory] embedding 100 sentences (one call), after one warm-up")
    minilm = await MiniLMEmbedder.load()
    for name, embedder in (("minilm int8 (onnxruntime)", minilm), ("hashing", HashingEmbedder())):
        await embedder.embed(SENTENCES)
        samples = await timed(10, partial(embedder.embed, SENTENCES))
        print(f"  {name:<28} {_p(samples)}")
    one = await timed(100, lambda: minilm.embed(["I always want a window seat"]))
    print(f"  {'minilm, one query':<28} {_p(one)}")


async def _search(repeat: int) -> None:
    print("\n[memory] search, top 5, filtered by user (tenant + application + user)")
    rng = np.random.default_rng(7)
    queries = _unit(rng, repeat)
    searcher = _scope(3)
    with tempfile.TemporaryDirectory() as tmp:
        edge = await EdgeStore.open(Path(tmp) / "qdrant", DIMENSION)
        local = await QdrantClientStore.open(DIMENSION, location=":memory:")
        filled = 0
        try:
            for size in SIZES:
                await _fill(edge, filled, size, rng)
                if size in LOCAL_MODE_SIZES:
                    await _fill(local, filled, size, rng)
                filled = size
                match = searcher.search_filter("user")
                found = await edge.search(queries[0], match, 5)
                assert found, "the searcher has memories at every size"
                assert all(r.scope.user_id == "u3" for r, _ in found)
                rows: list[tuple[str, Store, dict[str, str]]] = [
                    ("edge, by user", edge, match),
                    ("edge, unfiltered (baseline)", edge, {}),
                ]
                if size in LOCAL_MODE_SIZES:
                    rows.append(("qdrant-client local mode", local, match))
                for name, store, where in rows:
                    runs = repeat if store is edge else max(20, repeat // (size // 1000))
                    samples = []
                    for query in queries[:runs]:
                        began = time.perf_counter()
                        await store.search(query, where, 5)
                        samples.append(time.perf_counter() - began)
                    print(f"  {size:>7,} memories  {name:<28} {_p(samples)}")
        finally:
            await edge.close()
            await local.close()


async def _store(n: int) -> None:
    print(f"\n[memory] store throughput, {n} one-fact writes (64 in flight), edge shard")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        rng = np.random.default_rng(3)
        raw = await EdgeStore.open(Path(tmp) / "raw", DIMENSION)
        start = time.perf_counter()
        await _fill(raw, 0, n, rng)
        rate = n / (time.perf_counter() - start)
        print(f"  {'raw shard upserts, 2000/batch (baseline)':<48} {rate:9.0f} facts/s")
        await raw.close()
        embedders: list[tuple[str, Embedder]] = [
            ("hashing", HashingEmbedder()),
            ("minilm", await MiniLMEmbedder.load()),
        ]
        for name, embedder in embedders:
            service_nc, client_nc = await nats.connect(server.url), await nats.connect(server.url)
            service = MemoryService(
                service_nc,
                embedder=embedder,
                data_dir=Path(tmp) / f"qdrant-{name}",
                options=ServiceOptions(tracer_provider=create_tracer_provider("memory")),
            )
            await service.start()
            bus = Bus(client_nc, trace.get_tracer("bench"))
            limit = asyncio.Semaphore(64)

            async def request(i: int, bus: Bus = bus, limit: asyncio.Semaphore = limit) -> None:
                caller = RunContext(
                    run_id=f"r{i}", session_id="s1", agent="travel", props=_props(i)
                )
                async with limit:
                    await bus.request(
                        subjects.MEMORY_STORE,
                        MemoryStore(texts=[f"request fact {i}"]),
                        ops.MEMORY_STORE.decode_reply,
                        ctx=caller,
                    )

            start = time.perf_counter()
            await asyncio.gather(*(request(i) for i in range(n)))
            rate = n / (time.perf_counter() - start)
            print(f"  {'request/reply runbus.memory.store, ' + name:<48} {rate:9.0f} facts/s")

            js = client_nc.jetstream()
            start = time.perf_counter()
            for i in range(n):
                caller = RunContext(
                    run_id=f"w{i}", session_id="s1", agent="travel", props=_props(i)
                )
                await js.publish(
                    subjects.MEMORY_WRITES,
                    encode(MemoryStore(texts=[f"streamed fact {i}"])),
                    headers=caller.to_headers(),
                )
            published = time.perf_counter() - start
            while True:
                info = await js.consumer_info(
                    subjects.MEMORY_WRITES_STREAM, subjects.MEMORY_WRITES_CONSUMER
                )
                if not info.num_pending and not info.num_ack_pending:
                    break
                await asyncio.sleep(0.01)
            rate = n / (time.perf_counter() - start)
            print(
                f"  {'writes stream, publish → stored, ' + name:<48} {rate:9.0f} facts/s"
                f"   (publishing alone {n / published:7.0f}/s)"
            )
            await service.stop()
            await service_nc.drain()
            await client_nc.drain()


def _props(i: int) -> dict[str, str]:
    return {"tenant": f"t{i % 10}", "user_id": f"u{i % USERS}"}


async def run_benchmark(repeat: int = 500, writes: int = 2000) -> None:
    await _embedding()
    await _search(repeat)
    await _store(writes)


if __name__ == "__main__":
    import uvloop

    from runbus.logs import configure_logging

    configure_logging("warning")
    uvloop.run(run_benchmark())
