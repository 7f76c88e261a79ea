"""Where the overhead of one run at a 300 ms model goes: the slow-model agent (4 model calls,
3 tools) run by run, one at a time, on the six-process stack with every process exporting its
spans (`OTEL_TRACES_EXPORTER=console`, read back from the process logs). Each run's time beyond
4 x 300 ms is cut along its critical path (the gateway works a run one step at a time):

- the model calls beyond the model's 300 ms (`chat` span: HTTP client, loopback server),
- model_router's work around each call (its `process` span minus the `chat` span),
- each bus round trip (the gateway's `send` span minus the handler's `process` span: codecs,
  headers, nats-server, both event loops),
- the handlers of history, tool_executor and the others (their `process` spans),
- the run's checkpoints the gateway stores straight into the history stream (its PRODUCER
  spans: publish and ack),
- the gateway between its hops (its run span minus its `send` spans and those checkpoints:
  steps, event publishes),
- the client's edges: the request published → the gateway's run span starts (JetStream, the
  gateway's consumer), and the final event's way back, net of the run span's tail after it.

Recording and exporting spans costs a little itself; the runs' total is printed next to the
parts so the two can be compared with the slow-model section's runs at 1 in flight."""

import asyncio
import collections
import json
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.processes import process_stack
from bench.results import Overhead, OverheadModelServer
from bench.slow_model import LATENCY, ROUTES, SLOW_AGENT, loopback_server
from bench.whole_run import Clients

MODEL_CALLS = 4
SPAN_EXPORT = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "200"}
"""Every process prints its spans as JSON to its log, a batch every 200 ms."""


def read_spans(logs: Path) -> list[dict[str, Any]]:
    """The spans the processes printed: each log holds the console exporter's JSON objects,
    raw (the gateways the bench starts) or as the `text` of the supervisor's log lines."""
    spans: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for log in sorted(logs.glob("*.log")):
        raw = log.read_text(errors="replace")
        texts = []
        for line in raw.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "output":
                texts.append(str(record.get("text", "")))
        blob = "\n".join(texts) if texts else raw
        at = 0
        while (start := blob.find("{", at)) >= 0:
            try:
                found, at = decoder.raw_decode(blob, start)
            except ValueError:
                at = start + 1
                continue
            if isinstance(found, dict) and "context" in found and "start_time" in found:
                found["service"] = log.stem
                spans.append(found)
    return spans


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _duration_ms(span: dict[str, Any]) -> float:
    return (_seconds(span["end_time"]) - _seconds(span["start_time"])) * 1000


def _family(name: str) -> str:
    """`send runbus.history.append` → `history.append`; `runbus.tools.{name}.invoke` →
    `tools.invoke`."""
    subject = name.split(" ", 1)[-1].removeprefix("runbus.")
    return ".".join(part for part in subject.split(".") if not part.startswith("{"))


def breakdown(
    spans: list[dict[str, Any]], sent_at: float, client_ms: float, latency_ms: float
) -> dict[str, float] | None:
    """One run's overhead beyond MODEL_CALLS x `latency_ms`, by part (see the module's doc);
    None when its run span is missing."""
    roots = [s for s in spans if s["kind"].endswith("CONSUMER") and "runbus.runs" in s["name"]]
    if not roots:
        return None
    root = roots[0]
    by_parent: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for span in spans:
        if span.get("parent_id"):
            by_parent[span["parent_id"]].append(span)
    parts: dict[str, float] = collections.defaultdict(float)
    sends = [
        s for s in spans if s["service"].startswith("gateway") and s["kind"].endswith("CLIENT")
    ]
    for send in sends:
        family = _family(send["name"])
        handlers = [
            s for s in by_parent[send["context"]["span_id"]] if s["kind"].endswith("SERVER")
        ]
        handled = _duration_ms(handlers[0]) if handlers else 0.0
        parts[f"bus round trip: {family}"] += _duration_ms(send) - handled
        if not handlers:
            continue
        inner = [
            s for s in by_parent[handlers[0]["context"]["span_id"]] if s["name"].startswith("chat")
        ]
        if family == "model.complete" and inner:
            chat = _duration_ms(inner[0])
            parts["model call beyond the model's latency (HTTP)"] += chat - latency_ms
            parts["model_router around the call"] += handled - chat
        else:
            parts[f"handler: {family}"] += handled
    stored = [
        s for s in spans if s["service"].startswith("gateway") and s["kind"].endswith("PRODUCER")
    ]
    for checkpoint in stored:
        parts["history stream: direct checkpoints"] += _duration_ms(checkpoint)
    run_span = _duration_ms(root)
    request_in = (_seconds(root["start_time"]) - sent_at) * 1000
    parts["gateway between its hops"] += run_span - sum(_duration_ms(s) for s in sends + stored)
    parts["request in: published → the gateway's run span starts"] += request_in
    # The run span ends after the final event is out (the request's ack): this part is
    # the final event's way to the client net of that tail, and may be below zero.
    parts["final event out, net of the run span's tail"] += client_ms - run_span - request_in
    return dict(parts)


async def measure(runs: int = 10) -> Overhead:
    latency_ms = LATENCY * 1000
    print(
        f"\n[overhead] one run at a time, {latency_ms:.0f} ms model: where the time beyond "
        f"{MODEL_CALLS} x {latency_ms:.0f} ms goes (spans of every process)"
    )
    timings: list[tuple[float, float]] = []
    with loopback_server() as model, tempfile.TemporaryDirectory() as tmp_name:
        routes = Path(tmp_name) / "routes.toml"
        routes.write_text(ROUTES.format(url=model.url))
        env = {"RUNBUS_MODEL_ROUTES": str(routes), **SPAN_EXPORT}
        async with process_stack(agents={"slow": SLOW_AGENT}, env=env) as stack:
            clients = await Clients.open(stack.url, count=1)
            try:
                for _ in range(2):  # the first run lists the tools and warms every path
                    await clients.one("slow")
                model.stats()  # starts the server's count afresh
                for _ in range(runs):
                    start = time.time()
                    elapsed = await clients.one("slow")
                    timings.append((start, elapsed))
                after = model.stats()
            finally:
                await clients.close()
            spans = await _spans_of(stack.data / "logs", len(timings))
    traces: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for span in spans:
        traces[span["context"]["trace_id"]].append(span)
    by_run: list[dict[str, float]] = []
    for start, elapsed in timings:
        for trace in traces.values():
            first = min(_seconds(s["start_time"]) for s in trace)
            if start <= first <= start + elapsed:
                parts = breakdown(trace, start, elapsed * 1000, latency_ms)
                if parts is not None:
                    by_run.append(parts)
                break
    total = statistics.median(e * 1000 - MODEL_CALLS * latency_ms for _, e in timings)
    names = {name for parts in by_run for name in parts}
    ranked = sorted(
        ((name, statistics.median(p.get(name, 0.0) for p in by_run)) for name in names),
        key=lambda item: -item[1],
    )
    print(
        f"  {len(timings)} runs, {len(by_run)} traced: overhead p50 {total:.1f} ms beyond "
        f"{MODEL_CALLS} x {latency_ms:.0f} ms; its parts (median ms per run):"
    )
    for name, value in ranked:
        print(f"    {value:7.2f}  {name}")
    print(f"    {sum(v for _, v in ranked):7.2f}  sum of the parts")
    served = OverheadModelServer(
        late_p50_ms=after["late_ms"]["p50"],
        cpu_ms_per_call=after["cpu_s"] * 1000 / max(after["calls"], 1),
    )
    print(
        f"  of a model call, the model server's own: p50 {served.late_p50_ms:.2f} ms past "
        f"the {latency_ms:.0f} ms, {served.cpu_ms_per_call:.2f} ms CPU"
    )
    return Overhead(
        model_server=served,
        runs=len(timings),
        traced=len(by_run),
        latency_ms=latency_ms,
        overhead_p50_ms=total,
        parts_ms=dict(ranked),
    )


async def _spans_of(logs: Path, runs: int, wait_s: float = 10.0) -> list[dict[str, Any]]:
    """The spans printed so far, once the gateways' run spans of the measured runs are in
    (the exporters print in batches), and the other processes' batches after them."""
    deadline = time.monotonic() + wait_s
    while True:
        spans = read_spans(logs)
        roots = sum(
            1 for s in spans if s["kind"].endswith("CONSUMER") and "runbus.runs" in s["name"]
        )
        if roots >= runs + 2 or time.monotonic() > deadline:
            await asyncio.sleep(1.0)
            return read_spans(logs)
        await asyncio.sleep(0.3)
