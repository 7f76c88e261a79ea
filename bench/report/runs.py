"""The report's sections on runbus's own run: the floor and one hop, the whole run and its
messages, throughput, tool scaling, streaming, resume and the gateway's profile."""

from bench.report.cells import count, latency_row, ms, ratio, table, times
from bench.results import Results


def floor_section(results: Results) -> list[str]:
    floor = results.floor
    rr = floor.request_reply if floor else None
    out = ["## 1-2. Physical floor and one runbus hop (ms)", ""]
    return out + table(
        ["path", "p50", "p50 / raw", "p99", "p99 / raw"],
        [
            latency_row("raw nats-py request/reply (floor)", rr, rr),
            latency_row("raw JetStream publish (ack)", floor.js_publish if floor else None, rr),
            latency_row(
                "runbus Bus.request + Service", results.hop.runbus if results.hop else None, rr
            ),
        ],
    )


def whole_run_section(results: Results) -> list[str]:
    """Hops and events of one run next to their floor, then the run's latency and CPU."""
    whole = results.whole_run
    hops = whole.hops_per_run if whole else None
    events = whole.events_per_run if whole else None
    events = round(events, 1) if events is not None else None
    js = results.floor.js_publish.p50_ms if results.floor else None
    rr_p50 = results.floor.request_reply.p50_ms if results.floor else None
    fuller = (
        hops * rr_p50 + events * js
        if hops is not None and events is not None and js is not None and rr_p50 is not None
        else None
    )
    run_p50 = whole.runbus.p50_ms if whole and whole.runbus else None
    out = [
        "## 3. Whole run: 3-tool travel run, zero-latency scripted model (ms)",
        "",
        f"Per run: {count(hops)} request/reply hops and {count(events)} run events published "
        "to JetStream (the run request is one more). Floor of the hops alone: "
        f"{count(hops)} x {ms(rr_p50)} ms; with the event publishes at the JetStream floor, "
        f"{ms(fuller)} ms, which the six-process run takes {times(ratio(run_p50, fuller))} of. "
        "CPU per run is the sum over every process (services, nats-server, client) for runbus, "
        "the one process for MAF.",
        "",
    ]
    out += messages_section(results)
    out += table(
        ["", "p50", "p99", "p50 / MAF", "p50 / (hops x floor)", "CPU ms/run", "CPU / MAF"],
        whole_run_rows(results),
    )
    cpu = whole.runbus.cpu_ms_per_run.by_process if whole and whole.runbus else {}
    if cpu:
        out += ["CPU ms per run by process: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())]
        out += [""]
    return out


def messages_section(results: Results) -> list[str]:
    """Messages of one run on the services' account, by kind and by hop subject."""
    messages = results.whole_run.messages if results.whole_run else None
    if messages is None:
        return []
    other = messages.kv_and_other_by_subject
    return [
        f"Messages per run on the services' account ({messages.runs} sequential "
        "runs counted apart from the timed ones, by a subscription to every subject): "
        + ", ".join(f"{count(v)} {k}" for k, v in messages.by_kind.items() if v)
        + ". Request/reply hops by subject: "
        + (", ".join(f"`{k}` {count(v)}" for k, v in messages.hops_by_subject.items()) or "none")
        + (
            ". KV writes and other messages: "
            + ", ".join(f"`{k}` {count(v)}" for k, v in other.items())
            if other
            else ""
        )
        + ".",
        "",
        *stored_writes(messages.stored_by_stream),
    ]


def stored_writes(stored: dict[str, float]) -> list[str]:
    """What a run stores, by stream: each message an acknowledged, fsynced write."""
    if not stored:
        return []
    return [
        f"Stored writes per run (3-tool run; each an acknowledged write, fsynced with "
        f"`sync_interval: always`): {count(sum(stored.values()))} — "
        + ", ".join(f"`{k}` {count(v)}" for k, v in stored.items())
        + ".",
        "",
    ]


def whole_run_rows(results: Results) -> list[list[str]]:
    """runbus over the bus next to MAF in process and the physical floor of its hops."""
    maf = results.maf
    whole = results.whole_run
    floor = results.floor.request_reply.p50_ms if results.floor else None
    hops = whole.hops_per_run if whole else None
    run_floor = hops * floor if hops is not None and floor is not None else None
    maf_p50 = maf.p50_ms if maf else None
    maf_cpu = maf.cpu_ms_per_run if maf else None
    runbus = whole.runbus if whole else None
    in_process = whole.in_process if whole else None
    rows = []
    for name, point, cpu_ms in (
        ("MAF in process (anchor)", maf, maf_cpu),
        ("runbus, six processes", runbus, runbus.cpu_ms_per_run.total if runbus else None),
        ("runbus, services in one process", in_process, None),
    ):
        if point is None:
            continue
        rows.append(
            [
                name,
                ms(point.p50_ms),
                ms(point.p99_ms),
                times(ratio(point.p50_ms, maf_p50)),
                times(ratio(point.p50_ms, run_floor)),
                "-" if cpu_ms is None else f"{cpu_ms:.2f}",
                times(ratio(cpu_ms, maf_cpu)),
            ]
        )
    return rows


def throughput_section(results: Results) -> list[str]:
    gateways = results.throughput
    maf_rates = results.maf.runs_per_s if results.maf else {}
    if not gateways:
        return []
    out = ["## 4. Throughput: runs/s and run latency by clients and gateway replicas", ""]
    one = gateways.get("1", {})
    rows = []
    for replicas, points in gateways.items():
        for clients, point in points.items():
            base = one.get(clients)
            rows.append(
                [
                    replicas,
                    clients,
                    f"{point.runs_per_s:.1f}",
                    times(ratio(point.runs_per_s, base.runs_per_s if base else None)),
                    times(ratio(point.runs_per_s, maf_rates.get(clients))),
                    ms(point.p50_ms),
                    ms(point.p99_ms),
                ]
            )
    return out + table(
        ["gateways", "clients", "runs/s", "vs 1 gateway", "vs MAF", "p50 ms", "p99 ms"], rows
    )


def scaling_section(results: Results) -> list[str]:
    points = results.tool_scaling
    if not points:
        return []
    base = points[0].calls_per_s
    out = ["## 4. tool_executor scaling: 50 ms I/O tool, 128 calls in flight", ""]
    return out + table(
        ["replicas", "calls/s", "vs 1 replica", "ideal", "of ideal", "p50 ms", "p99 ms"],
        [
            [
                str(p.replicas),
                f"{p.calls_per_s:.0f}",
                times(ratio(p.calls_per_s, base)),
                f"{p.ideal:.0f}",
                f"{p.calls_per_s / p.ideal:.0%}",
                ms(p.p50_ms),
                ms(p.p99_ms),
            ]
            for p in points
        ],
    )


def streaming_section(results: Results) -> list[str]:
    streaming = results.streaming
    if streaming is None:
        return []
    direct, bus = streaming.direct, streaming.bus
    out = ["## 5. Streaming: time to the first text delta (µs)", ""]
    return out + table(
        ["path", "p50", "p99", "added p50", "added p99"],
        [
            ["backend called directly", f"{direct.p50_us:.0f}", f"{direct.p99_us:.0f}", "", ""],
            [
                "run.text_delta at a bus subscriber",
                f"{bus.p50_us:.0f}",
                f"{bus.p99_us:.0f}",
                f"{bus.p50_us - direct.p50_us:+.0f}",
                f"{bus.p99_us - direct.p99_us:+.0f}",
            ],
        ],
    )


def resume_section(results: Results) -> list[str]:
    processes = results.resume
    lowered = results.resume_in_process
    if processes is None and lowered is None:
        return []
    out = ["## Resume: a run whose gateway died", ""]
    if processes:
        out += [
            f"Processes: the gateway SIGKILLed while the run waited on a 1 s tool, a new gateway "
            f"started at once (ready after {processes.new_gateway_ready_s:.1f} s): "
            f"**{processes.kill_to_completed_s:.1f} s** from the kill to `run.completed`, "
            f"with the gateway's ack_wait of {processes.ack_wait_s:g} s "
            "(`RUNBUS_RUN_ACK_WAIT`, left at its default).",
            "",
        ]
    if lowered:
        rest = lowered.kill_to_completed_s - lowered.ack_wait_s - lowered.tool_s
        out += [
            f"In process, ack_wait lowered to {lowered.ack_wait_s:g} s, the gateway's "
            "connection closed while the run waited on a tool of "
            f"{lowered.tool_s:g} s, a new replica started just before: median "
            f"**{lowered.kill_to_completed_s:.2f} s** over {len(lowered.trials)} kills; "
            f"{rest:+.2f} s beyond ack_wait + the tool call repeated (the redelivery comes "
            "ack_wait after the last `in_progress`, which is sent every ack_wait / 3).",
            "",
        ]
    return out


def profile_section(results: Results) -> list[str]:
    profile = results.profile
    if profile is None:
        return []
    return [
        "## Gateway profile",
        "",
        f"pyinstrument (wall clock) over the gateway process while it served "
        f"{profile.runs} sequential runs (and its start and drain): "
        f"{profile.wall_s:.1f} s wall, {profile.cpu_s:.1f} s CPU; the call tree is "
        f"`{profile.profile}`. Functions by their own time inside the event loop (the "
        "first row, the loop's own, is mostly waiting for the network):",
        "",
        "```",
        *profile.top_self_time,
        "```",
        "",
    ]


def printed_sections(results: Results) -> list[str]:
    """The per-service sections' printed text, as they printed it."""
    out = []
    for name, text in results.sections.items():
        out += [f"## {name} (printed by bench/{name}.py)", "", "```", text.rstrip(), "```", ""]
    return out


def held_deltas_section(results: Results) -> list[str]:
    """What output guardrails cost: the text held until they pass against the same answer
    streamed."""
    held = results.held_deltas
    if held is None:
        return []
    rows = [
        ("streamed (no output guardrails)", held.streamed_first_ms, held.streamed_completed_ms),
        ("held until output guardrails pass", held.held_first_ms, held.held_completed_ms),
    ]
    return [
        "## Held deltas: the latency of output guardrails",
        "",
        f"A scripted model streams {held.words} words, one every {held.pace_ms:g} ms; the "
        f"median of {held.runs} runs of each agent, interleaved. Holding the text moves the "
        "first byte to the end of the answer; `run.completed` comes "
        f"{held.held_completed_ms - held.streamed_completed_ms:+.1f} ms from the streamed run's "
        f"({times(ratio(held.held_completed_ms, held.streamed_completed_ms))} of it).",
        "",
        *table(
            ["agent", "first text byte (ms)", "run.completed (ms)"],
            [[name, f"{first:.1f}", f"{done:.1f}"] for name, first, done in rows],
        ),
    ]
