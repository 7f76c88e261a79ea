"""The bench's own measuring: a run's overhead cut along its spans (bench/overhead.py), a
level's rounds made one point (bench/slow_model.py), the bus's messages sorted by kind
(bench/whole_run.py)."""

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from bench.loopback_model import Stats
from bench.overhead import breakdown, read_spans
from bench.slow_model import median_point
from bench.whole_run import bus_kind
from nats.aio.msg import Msg


def span(
    service: str,
    kind: str,
    name: str,
    start_ms: float,
    end_ms: float,
    span_id: str,
    parent: str | None = None,
) -> dict[str, Any]:
    def stamp(at_ms: float) -> str:
        seconds, ms = divmod(at_ms, 1000)
        return f"2026-12-03T10:00:{int(seconds):02d}.{int(ms * 1000):06d}Z"

    return {
        "service": service,
        "kind": f"SpanKind.{kind}",
        "name": name,
        "context": {"trace_id": "0x1", "span_id": span_id},
        "parent_id": parent,
        "start_time": stamp(start_ms),
        "end_time": stamp(end_ms),
    }


def one_run() -> list[dict[str, Any]]:
    """A gateway run span of 700 ms: a model call (its `chat` span 305 ms) and a history
    append, each sent over the bus, and a checkpoint stored straight into the stream."""
    return [
        span("gateway-1", "CONSUMER", "process runbus.runs.{agent}", 0, 700, "root"),
        span("gateway-1", "CLIENT", "send runbus.model.complete", 10, 320, "s1", "root"),
        span("model_router", "SERVER", "process runbus.model.complete", 11, 318, "h1", "s1"),
        span("model_router", "INTERNAL", "chat bench-300ms", 12, 317, "c1", "h1"),
        span("gateway-1", "CLIENT", "send runbus.history.append", 321, 324, "s2", "root"),
        span("history", "SERVER", "process runbus.history.append", 322, 323, "h2", "s2"),
        span(
            "gateway-1",
            "PRODUCER",
            "send runbus.hist.{tenant}.{session_id}",
            330,
            331.5,
            "p1",
            "root",
        ),
    ]


def test_a_runs_overhead_is_cut_along_its_critical_path() -> None:
    sent_at = datetime(2026, 12, 3, 9, 59, 59, 998000, tzinfo=UTC).timestamp()  # 2 ms early

    parts = breakdown(one_run(), sent_at, client_ms=704.0, latency_ms=300.0)

    assert parts == pytest.approx(
        {
            "model call beyond the model's latency (HTTP)": 5.0,
            "model_router around the call": 2.0,
            "bus round trip: model.complete": 3.0,
            "bus round trip: history.append": 2.0,
            "handler: history.append": 1.0,
            "history stream: direct checkpoints": 1.5,
            "gateway between its hops": 700.0 - 310.0 - 3.0 - 1.5,
            "request in: published → the gateway's run span starts": 2.0,
            "final event out, net of the run span's tail": 2.0,
        },
        abs=1e-3,
    )


def test_a_trace_without_the_gateways_run_span_is_not_cut() -> None:
    assert breakdown(one_run()[1:], 0.0, client_ms=704.0, latency_ms=300.0) is None


def test_spans_are_read_from_raw_and_from_supervised_logs(tmp_path: Path) -> None:
    first, second, *_ = one_run()
    (tmp_path / "gateway-1.log").write_text(json.dumps(first, indent=4) + "\n")
    wrapped = [
        json.dumps({"event": "output", "service": "model_router", "text": line})
        for line in json.dumps(second, indent=4).splitlines()
    ]
    (tmp_path / "model_router.log").write_text(
        '{"event": "started", "level": "info"}\n' + "\n".join(wrapped) + "\n"
    )

    spans = read_spans(tmp_path)

    assert sorted((s["service"], s["name"]) for s in spans) == [
        ("gateway-1", "process runbus.runs.{agent}"),
        ("model_router", "send runbus.model.complete"),
    ]


def test_a_level_is_its_median_round_with_every_rounds_failures() -> None:
    def round_(rate: float, failures: int, peak: float) -> dict[str, Any]:
        return {
            "runs": 100,
            "runs_per_s": rate,
            "failures": failures,
            "failure_kinds": [f"kind {failures}"] if failures else [],
            "p50_ms": 1000 / rate,
            "p99_ms": 2000 / rate,
            "cpu_ms_per_run": rate,
            "peak_rss_mib": {"gateway#1": peak},
        }

    point = median_point([round_(10.0, 0, 80.0), round_(30.0, 2, 70.0), round_(20.0, 1, 60.0)])

    assert point["runs_per_s"] == 20.0
    assert point["rounds_runs_per_s"] == [10.0, 30.0, 20.0]
    assert point["runs"] == 300
    assert point["failures"] == 3
    assert point["failure_kinds"] == ["kind 1", "kind 2"]
    assert point["p50_ms"] == 50.0
    assert point["peak_rss_mib"] == {"gateway#1": 80.0}


@pytest.mark.parametrize(
    ("subject", "reply", "kind"),
    [
        ("runbus.runs.travel", "_INBOX.a", "run requests"),
        ("runbus.events.acme.alice.r-1", "", "run events"),
        ("runbus.history.append", "_RBSVC.abc.1", "request/reply hops"),
        ("_RBSVC.abc.1", "", "replies"),
        ("runbus.hist.acme.s-1", "_RBSVC.abc.2", "history stream writes"),
        ("$KV.RUNBUS_SESSIONS.acme.s-1", "_RBSVC.abc.3", "KV writes"),
        ("$JS.API.CONSUMER.CREATE.RUNBUS_EVENTS", "_INBOX.b", "JetStream API"),
        ("$JS.ACK.RUNBUS_RUNS.gateway.1.2.3.4.5", "", "JetStream acks"),
        ("runbus.progress.history", "", "other"),
    ],
)
def test_a_message_on_the_bus_is_sorted_by_its_subject(subject: str, reply: str, kind: str) -> None:
    assert bus_kind(Msg(None, subject=subject, reply=reply)) == kind  # type: ignore[arg-type]


def test_the_model_servers_account_covers_the_time_since_the_last_one() -> None:
    seen = Stats(late_ms=[1.0, 3.0, 2.0], body_ms=[5.0, 5.0, 5.0], lag_ms=[0.5])

    first = seen.summary()
    second = seen.summary()

    assert first["calls"] == 3
    assert first["late_ms"] == {"p50": 2.0, "p99": 2.0, "max": 3.0}
    assert first["wall_s"] > 0
    assert second["calls"] == 0  # the first summary started the count afresh
    assert second["late_ms"] == {"p50": 0.0, "p99": 0.0, "max": 0.0}
