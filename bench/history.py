"""History benchmark: loading sessions of 10 / 100 / 1,000 messages through the history
service, next to raw JetStream reads of the same data; appends next to raw JetStream publishes.
Both measured in the same run on the same server."""

import statistics
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from opentelemetry import trace

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.messages import ChatMessage, HistoryAppend, HistoryLoad, TextContent, encode
from runbus.messages.sessions import SessionOpen
from runbus.service import ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_history.service import HistoryService
from runbus_history.store import read_subject

SIZES = (10, 100, 1000)
PER_APPEND = 4  # a run's checkpoints: user, assistant, tool, assistant


def _messages(run: int, count: int = PER_APPEND) -> list[ChatMessage]:
    return [
        ChatMessage(
            role="user" if i == 0 else "assistant",
            contents=[TextContent(text=f"message {i} of run {run}: " + "words " * 30)],
            message_id=f"r{run}:m{i}",
        )
        for i in range(count)
    ]


def _p(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return f"p50 {statistics.median(ms):7.3f} ms  p99 {ms[int(0.99 * (len(ms) - 1))]:7.3f} ms"


async def _fill(bus: Bus, ctx: RunContext, session_id: str, messages: int) -> None:
    await bus.request(
        subjects.SESSIONS_OPEN,
        SessionOpen(session_id=session_id),
        ops.SESSIONS_OPEN.decode_reply,
        ctx=ctx,
    )
    for run, start in enumerate(range(0, messages, PER_APPEND)):
        await bus.request(
            subjects.HISTORY_APPEND,
            HistoryAppend(
                session_id=session_id,
                messages=_messages(run, min(PER_APPEND, messages - start)),
            ),
            ops.HISTORY_APPEND.decode_reply,
            ctx=ctx,
        )


async def run_benchmark(repeat: int = 200) -> None:
    print("\n[history] load a session / append a run's messages (service vs raw JetStream)")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        service_nc, client_nc = await nats.connect(server.url), await nats.connect(server.url)
        service = HistoryService(
            service_nc, options=ServiceOptions(tracer_provider=create_tracer_provider("history"))
        )
        await service.start()
        bus = Bus(client_nc, trace.get_tracer("bench"))
        ctx = RunContext(
            run_id="bench", agent="bench", props={"tenant": "acme", "user_id": "alice"}
        )
        for size in SIZES:
            session_id = f"s{size}"
            await _fill(bus, ctx, session_id, size)
            load = HistoryLoad(session_id=session_id)
            raw, served = [], []
            for _ in range(max(10, repeat // (size // 10))):
                start = time.perf_counter()
                [
                    d
                    async for d in read_subject(
                        client_nc, subjects.history_log("acme", session_id), 5.0
                    )
                ]
                raw.append(time.perf_counter() - start)
                start = time.perf_counter()
                loaded = await bus.request(
                    subjects.HISTORY_LOAD, load, ops.HISTORY_LOAD.decode_reply, ctx=ctx
                )
                served.append(time.perf_counter() - start)
            assert len(loaded.messages) == size
            ratio = statistics.median(served) / statistics.median(raw)
            print(
                f"  load {size:>5} messages  raw {_p(raw)}   service {_p(served)}   "
                f"ratio {ratio:.2f}x"
            )
        await _appends(client_nc, bus, ctx, repeat * 5)
        await service.stop()
        await service_nc.drain()
        await client_nc.drain()


async def _appends(nc: NATS, bus: Bus, ctx: RunContext, count: int) -> None:
    js = nc.jetstream()
    batches = [_messages(run + 100_000) for run in range(count)]
    start = time.perf_counter()
    for n, batch in enumerate(batches):
        await js.publish(
            subjects.history_log("acme", "raw"),
            encode(HistoryAppend(session_id="raw", messages=batch)),
            headers={"Nats-Msg-Id": f"raw-{n}"},
        )
    raw_rate = count / (time.perf_counter() - start)
    await bus.request(
        subjects.SESSIONS_OPEN,
        SessionOpen(session_id="appends"),
        ops.SESSIONS_OPEN.decode_reply,
        ctx=ctx,
    )
    start = time.perf_counter()
    for batch in batches:
        await bus.request(
            subjects.HISTORY_APPEND,
            HistoryAppend(session_id="appends", messages=batch),
            ops.HISTORY_APPEND.decode_reply,
            ctx=ctx,
        )
    rate = count / (time.perf_counter() - start)
    print(
        f"  append {PER_APPEND} messages, sequential: raw JetStream {raw_rate:7.0f}/s   "
        f"service {rate:7.0f}/s   ratio {raw_rate / rate:.2f}x slower"
    )
