"""Compaction benchmarks: every strategy on 100 / 1,000 / 10,000-message histories as a pure
function, the same over the bus, and incremental vs full recompaction of a growing session.

The baseline, measured in the same run, is `none`: grouping, repair and token counting with no
strategy. The summariser is a function that answers at once, so the numbers are compaction's own
cost, not a model's. Run alone with `uv run python bench/compaction.py`.
"""

import asyncio
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runbus import ops, subjects
from runbus.bus import Bus
from runbus.embedded import EmbeddedNats
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    CompactRequest,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    encode,
)
from runbus.messages.compaction import (
    CompactionStrategy,
    ContextWindowCompaction,
    HasToolCalls,
    NoCompaction,
    PipelineCompaction,
    SlidingWindowCompaction,
    SummarizationCompaction,
    TokensExceed,
    ToolResultCompaction,
    TruncationCompaction,
    TurnsExceed,
)
from runbus.service import ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_compaction.service import CompactionService
from runbus_compaction.strategies import SummaryCall, SummaryReply, compact
from runbus_compaction.tokens import BYTES, TokenCounter, counter_for

SIZES = (100, 1_000, 10_000)
FLIGHTS = [
    {
        "flight_id": f"QF{400 + i}-20261208",
        "airline": "Qantas",
        "departs": f"{6 + i:02d}:15",
        "arrives": f"{7 + i:02d}:40",
        "price_aud": 129 + 13 * i,
    }
    for i in range(4)
]


def history(messages: int) -> list[ChatMessage]:
    """Instructions, then turns of a question, a flight search with its ~550-byte result and an
    answer, cut to `messages`."""
    prompt = [
        ChatMessage(
            role="system",
            contents=[TextContent(text="You are a travel assistant. Use the tools.")],
            message_id="instructions",
        )
    ]
    turn = 0
    while len(prompt) < messages:
        call_id = f"call-{turn}"
        prompt += [
            ChatMessage(
                role="user",
                contents=[TextContent(text=f"Flights Melbourne to Sydney, option {turn}?")],
                message_id=f"u{turn}",
            ),
            ChatMessage(
                role="assistant",
                contents=[
                    FunctionCallContent(
                        call_id=call_id,
                        name="search_flights",
                        arguments={"origin": "Melbourne", "destination": "Sydney"},
                    )
                ],
                message_id=f"a{turn}",
            ),
            ChatMessage(
                role="tool",
                contents=[FunctionResultContent(call_id=call_id, result=FLIGHTS)],
                message_id=f"t{turn}",
            ),
            ChatMessage(
                role="assistant",
                contents=[TextContent(text="The cheapest is Qantas QF400 at 06:15 for A$129.")],
                message_id=f"r{turn}",
            ),
        ]
        turn += 1
    return prompt[:messages]


def strategies() -> dict[str, CompactionStrategy]:
    over = TokensExceed(tokens=4_000)
    return {
        "none (baseline)": NoCompaction(),
        "tool_result": ToolResultCompaction(trigger=HasToolCalls()),
        "summarization": SummarizationCompaction(trigger=over, route="bench"),
        "sliding_window": SlidingWindowCompaction(trigger=TurnsExceed(turns=8)),
        "truncation": TruncationCompaction(trigger=over),
        "pipeline (essay)": PipelineCompaction(
            steps=[
                ToolResultCompaction(trigger=TokensExceed(tokens=512)),
                SummarizationCompaction(trigger=TokensExceed(tokens=1280), route="bench"),
                SlidingWindowCompaction(trigger=TurnsExceed(turns=8)),
                TruncationCompaction(trigger=over, minimum_preserved=10),
            ]
        ),
        "context_window": ContextWindowCompaction(max_context=8_000, max_output=1_000),
    }


async def instant_summary(call: SummaryCall) -> SummaryReply:
    return SummaryReply(text="The user compared flights from Melbourne to Sydney.")


def compacting(
    prompt: list[ChatMessage], strategy: CompactionStrategy, counter: TokenCounter = BYTES
) -> Callable[[], Awaitable[object]]:
    def call() -> Awaitable[object]:
        return compact(prompt, strategy, counter=counter, summarize=instant_summary)

    return call


def repetitions(messages: int) -> int:
    return max(3, 20_000 // messages)


async def median_ms(n: int, call: Callable[[], Awaitable[object]]) -> float:
    """Median of `n` timed calls, each with the garbage collector off (as timeit does), so a
    collection triggered by an earlier call does not land on a later one."""
    samples = []
    for _ in range(n):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            await call()
            samples.append(time.perf_counter() - start)
        finally:
            gc.enable()
    return statistics.median(samples) * 1000


async def bench_pure() -> None:
    print("\n[compaction] pure function (compact(), instant summariser), median ms")
    print(f"  {'strategy':<22}" + "".join(f"{n:>12,} msg" for n in SIZES) + "   vs baseline @10k")
    prompts = {n: history(n) for n in SIZES}
    rows: dict[str, list[float]] = {}
    for name, strategy in strategies().items():
        rows[name] = [
            await median_ms(repetitions(n), compacting(prompts[n], strategy)) for n in SIZES
        ]
    cl100k = counter_for("cl100k")
    rows["none, cl100k counter"] = [
        await median_ms(repetitions(n), compacting(prompts[n], NoCompaction(), cl100k))
        for n in SIZES
    ]
    baseline = rows["none (baseline)"][-1]
    for name, cells in rows.items():
        print(
            f"  {name:<22}"
            + "".join(f"{ms:>16.2f}" for ms in cells)
            + f"   {cells[-1] / baseline:6.2f}x"
        )


async def bench_bus() -> None:
    print("\n[compaction] over the bus (one service, embedded nats-server), median ms round trip")
    ctx = RunContext(run_id="bench")
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        service_nc = await nats.connect(server.url)
        service = CompactionService(
            service_nc, options=ServiceOptions(tracer_provider=create_tracer_provider("bench"))
        )
        await service.start()
        client = await nats.connect(server.url)
        bus = Bus(client, create_tracer_provider("bench-client").get_tracer("bench"))
        limit = client.max_payload
        pipeline = strategies()["context_window"]
        try:
            for n in SIZES:
                for name, strategy in (("none", NoCompaction()), ("context_window", pipeline)):
                    request = CompactRequest(messages=history(n), strategy=strategy)
                    size = len(encode(request))
                    if size > limit:
                        print(
                            f"  {name:<16}{n:>7,} msg: body {size / 1e6:.1f} MB > max_payload "
                            f"{limit / 1e6:.1f} MB — does not fit in one NATS message"
                        )
                        continue

                    async def hop(r: CompactRequest = request) -> object:
                        return await bus.request(
                            subjects.COMPACTION_COMPACT,
                            r,
                            ops.COMPACTION_COMPACT.decode_reply,
                            ctx=ctx,
                        )

                    ms = await median_ms(repetitions(n) // 2 + 3, hop)
                    print(f"  {name:<16}{n:>7,} msg: {ms:9.2f} ms   (body {size / 1e3:.0f} kB)")
        finally:
            await service.stop()
            await service_nc.drain()
            await client.drain()


async def bench_incremental(turns: int = 250) -> None:
    """A session grows by one turn at a time; before each model call the prompt is compacted.
    Full: the whole history every time (in-prompt compaction). Incremental: last time's result
    plus the new turn, as `persist = true` would load it from history."""
    print(f"\n[compaction] growing session, {turns} turns (4 messages each), total ms")
    strategy = PipelineCompaction(
        steps=[
            ToolResultCompaction(trigger=TokensExceed(tokens=2_000)),
            SummarizationCompaction(trigger=TokensExceed(tokens=4_000), route="bench"),
            TruncationCompaction(trigger=TokensExceed(tokens=6_000)),
        ]
    )
    whole = history(1 + 4 * turns)
    summaries = {"full": 0, "incremental": 0}
    transcript_chars = {"full": 0, "incremental": 0}

    def counting(mode: str) -> Callable[[SummaryCall], Awaitable[SummaryReply]]:
        async def summarize(call: SummaryCall) -> SummaryReply:
            summaries[mode] += 1
            transcript_chars[mode] += sum(len(m.text) for m in call.messages)
            return await instant_summary(call)

        return summarize

    start = time.perf_counter()
    for turn in range(1, turns + 1):
        await compact(whole[: 1 + 4 * turn], strategy, summarize=counting("full"))
    full = time.perf_counter() - start

    start = time.perf_counter()
    carried = whole[:1]
    for turn in range(1, turns + 1):
        prompt = carried + whole[1 + 4 * (turn - 1) : 1 + 4 * turn]
        carried = (await compact(prompt, strategy, summarize=counting("incremental"))).messages
    incremental = time.perf_counter() - start

    for mode, total in (("full recompaction", full), ("incremental", incremental)):
        key = mode.split()[0]
        print(
            f"  {mode:<20}{total * 1000:9.1f} ms   summary calls {summaries[key]:4}   "
            f"text sent to the summariser {transcript_chars[key] / 1e6:6.2f} MB"
        )
    print(f"  incremental / full: {incremental / full:.2f}x the time")


def bench_estimate() -> None:
    """How far bytes / 4 is from cl100k_base on text this project carries."""
    root = Path(__file__).resolve().parent.parent
    seeds = root.parent / "shared" / "seeds"
    samples = {
        "English prose (docs/)": [p.read_text() for p in sorted(root.glob("docs/**/*.md"))],
        "Python source": [p.read_text() for p in sorted(root.glob("services/*/src/*/*.py"))],
        "JSON tool output": [msgspec.json.encode(FLIGHTS).decode()] * 50,
        "Chinese prose (seed essay)": [p.read_text() for p in sorted(seeds.glob("*.txt"))],
    }
    cl100k = counter_for("cl100k")
    print("\n[compaction] token estimate: bytes / 4 vs cl100k_base on samples")
    for name, texts in samples.items():
        if not texts:
            continue
        estimate = sum(BYTES.count(t) for t in texts)
        real = sum(cl100k.count(t) for t in texts)
        size = sum(len(t.encode()) for t in texts)
        print(
            f"  {name:<28}{size / 1e3:8.0f} kB   bytes/4 {estimate:7}   cl100k {real:7}   "
            f"estimate/real {estimate / real:5.2f}"
        )


async def run_benchmark() -> None:
    print(
        f"compaction bench — histories of {', '.join(f'{n:,}' for n in SIZES)} messages "
        f"(~{len(msgspec.json.encode(history(1000))) // 1000} kB per 1,000)"
    )
    bench_estimate()
    await bench_pure()
    await bench_bus()
    await bench_incremental()


if __name__ == "__main__":
    from runbus.logs import configure_logging

    configure_logging("warning")
    asyncio.run(run_benchmark())
