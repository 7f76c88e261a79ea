"""The report's section on the durable targets missed: where runbus's cost goes, next to the
anchor's, and what would close the gap."""

from bench.report.cells import count, ms
from bench.report.slow_model import SLOW
from bench.report.targets import durable_targets
from bench.results import Results, SlowPoint


def missed_section(results: Results) -> list[str]:
    """For the durable targets missed: where runbus's cost goes (the profile by process and
    the gateway's own functions), next to the anchor's, and what would close the gap."""
    missed = [t for t in durable_targets(results) if t.met is False]
    if not missed:
        return []
    out = ["## Missed targets: why, and what would close them", ""]
    names = {t.name for t in missed}
    if any("CPU" in n or "runs/s" in n for n in names):
        out += _cpu_bullet(results)
    slow = results.slow_model
    if any("in flight vs" in n for n in names) and slow:
        top = str(max(slow.levels or [0]))
        for key, label in SLOW:
            point = slow.points(key).get(top)
            if point is not None and point.failures:
                kinds = "; ".join(point.failure_kinds)
                out += [
                    f"- **{label} at {top} in flight**: {point.failures} of {point.runs} "
                    f"runs failed ({kinds}). A client follows each run with its own JetStream "
                    "consumer on the events stream, so a thousand followed runs are a thousand "
                    "consumers; following by a plain subscription (replay only after a gap) "
                    "removes that limit and the consumer's cost.",
                ]
        rb = slow.runbus.get(top)
        if rb is not None:
            out += [_slow_bound_bullet(top, rb)]
    if any("overhead" in n for n in names):
        by_part = results.overhead.parts_ms if results.overhead else {}
        first = ", ".join(f"{part} {ms(value)} ms" for part, value in list(by_part.items())[:3])
        out += [
            "- **Overhead of one run at 300 ms**: "
            + (
                f"the largest parts of runbus's overhead per run are {first} (the table above)."
                if first
                else "not broken down in this run (the `overhead` section)."
            )
            + " LangGraph's own four openai SDK calls are inside its overhead too; runbus adds "
            "a bus round trip and a handler for every model call, tool call and history append.",
        ]
    if any("RSS" in n for n in names):
        out += [
            "- **Memory**: the memory service holds its embedder and vector store even when no "
            "agent uses memory; loading them on first use (lazily) keeps an unused memory "
            "service small, and the other services are mostly the interpreter plus imports.",
        ]
    if any("session" in n for n in names):
        out += [
            "- **Session length**: with `persist = true` a run loads the latest compaction plus "
            "what came after, so run 100 costs what any run past the window costs; it still does "
            "more than run 1: a prompt of the window's turns shipped through each hop, one "
            "compaction hop (the window moves once per run), its `run.compacted` event, and the "
            "compaction's append through the history service. Run 1 of a new session also stores "
            "its first checkpoint straight into the stream, so the ratio's base is the cheapest "
            "run there is; a smaller window or a token trigger bounds run 100 further.",
        ]
    return [*out, ""]


def _cpu_bullet(results: Results) -> list[str]:
    """Where a run's CPU goes, process by process, and what was already done about it."""
    whole = results.whole_run
    runbus = whole.runbus if whole else None
    if runbus is None or not runbus.cpu_ms_per_run.by_process:
        return []
    postgres = results.anchors.langgraph_postgres if results.anchors else None
    pg = postgres.cpu_ms_by_process if postgres else {}
    hops = whole.hops_per_run if whole else None
    events = whole.events_per_run if whole else None
    ranked = sorted(runbus.cpu_ms_per_run.by_process.items(), key=lambda item: -item[1])
    parts = ", ".join(f"{k} {v:.1f}" for k, v in ranked)
    kinds = whole.messages.by_kind if whole and whole.messages else {}
    messages = sum(kinds.values()) if kinds else None
    one_gateway64 = results.throughput.get("1", {}).get("64")
    cpu64 = one_gateway64.cpu_ms_per_run if one_gateway64 else None
    pg64 = postgres.cpu_ms_per_run_by_clients if postgres else {}
    return [
        f"- **CPU per run** (the throughput targets follow from it on 2 cores): runbus "
        f"spends it as {parts}, client {ms(runbus.cpu_ms_per_run.client)} ms; LangGraph + "
        f"Postgres as anchor {ms(pg.get('anchor'))} + database {ms(pg.get('database'))} ms. "
        f"A run puts {count(messages)} messages on the services' bus ({count(hops)} "
        f"request/reply hops, {count(events)} run events, the stored writes and their acks "
        "counted above). Run one at a time, every message wakes a sleeping process at each "
        "end and nats-server, and on this machine the wake-ups cost more than the work: the "
        f"same runs at 64 clients, where one wake-up carries several messages, cost "
        f"{ms(cpu64)} ms each (LangGraph + Postgres {ms(pg64.get('64'))} ms). Already "
        "taken (each measured on its own when it landed): one history checkpoint per step, "
        "written by the gateway straight into the history stream; clients following a run "
        "by a plain subscription; no compaction hop under the trigger; the tool catalogue "
        "cached per agent; OpenTelemetry non-recording without an exporter; `gc.freeze()` "
        "after start; model_router's provider path on msgspec over HTTP; progress-aware "
        "calls on one subscription per connection, with no heartbeat before 0.5 s; KV "
        "reads by direct get; one JetStream context per connection (a context per event "
        "had left a subscription behind each); nats-server on one Go thread; a new "
        "session opened without reading what is stored under its id; a side-effecting call "
        "claimed without a lookup on its first send. What is left "
        "for runs one at a time is the count of messages itself, most of them what the "
        "run's durability costs: the checkpoint before tools, every event stored and "
        "acked, the run and session records, the side-effecting tool's record. Halving it "
        "needs fewer stored writes per run (an ack per event is the largest share), not "
        "cheaper code. The gateway's own profile is below (`gateway_profile.txt`).",
    ]


def _slow_bound_bullet(top: str, rb: SlowPoint) -> str:
    """What the runbus level at `top` in flight spent, and where the model server stood."""
    cores = rb.cores_by_process
    busy = sum(cores.values())
    text = (
        f"- **Runs/s at {top} in flight**: {rb.runs_per_s:.1f} runs/s x "
        f"{rb.cpu_ms_per_run:.0f} ms CPU per run = "
        f"{rb.runs_per_s * rb.cpu_ms_per_run / 1000:.2f} cores busy on a 2-core machine "
        "shared with other work"
    )
    if cores:
        name, most = max(cores.items(), key=lambda item: item[1])
        text += (
            f"; the busiest process, {name}, at {most:.2f} cores ({most / busy:.0%} of "
            "runbus's), runs one event loop: a second replica of it, or a cheaper call path "
            "in it, is what raises the ceiling"
        )
    model = rb.model_server
    if model:
        text += (
            f". The model server: {model.cores:.2f} cores, "
            f"{ms(model.cpu_ms_per_call)} ms CPU per call, answered p99 "
            f"{ms(model.late_p99_ms)} ms "
            f"past the latency, while its callers took p99 {ms(model.body_p99_ms)} ms to "
            "send a request body after its headers"
        )
    return text + "."
