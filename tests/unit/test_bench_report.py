"""bench/report/: the ratios, the target verdicts and the tables `make bench` writes, from
typed results (bench/results.py) built here as JSON-shaped dicts and decoded as results.json
is."""

from typing import Any

import msgspec
import pytest
from bench.report import markdown, targets
from bench.report.cells import ratio
from bench.report.runs import whole_run_rows
from bench.report.targets import durable_targets
from bench.results import Meta, Results, decode, encode

META: dict[str, Any] = {
    "timestamp": "t",
    "commit": "abc1234",
    "dirty": False,
    "machine": {
        "cpus": 2,
        "cpu_model": "a CPU",
        "platform": "Linux",
        "python": "3.11.7",
        "memory_gb": 8.0,
    },
    "quick": False,
    "loop": "uvloop",
}


def typed(results: dict[str, Any]) -> Results:
    return msgspec.convert(results, Results)


def level_point(rate: float, p50: float) -> dict[str, Any]:
    return {"runs_per_s": rate, "trials": [rate], "p50_ms": p50, "p99_ms": p50 * 2, "n": 300}


def results() -> dict[str, Any]:
    return {
        "meta": META,
        "floor": {
            "request_reply": {"p50_ms": 0.1, "p99_ms": 0.4, "n": 3000},
            "js_publish": {"p50_ms": 0.05, "p99_ms": 0.2, "n": 3000},
        },
        "hop": {"runbus": {"p50_ms": 0.125, "p99_ms": 0.6, "n": 3000}},
        "maf": {
            "n": 300,
            "p50_ms": 1.0,
            "p99_ms": 2.0,
            "cpu_ms_per_run": 1.0,
            "tool_calls_per_run": 3,
            "model_calls_per_run": 4,
            "runs_per_s": {"1": 800.0, "64": 1000.0},
        },
        "whole_run": {
            "hops_per_run": 18,
            "events_per_run": 10,
            "runbus": {
                "p50_ms": 3.6,
                "p99_ms": 9.0,
                "n": 300,
                "cpu_ms_per_run": {
                    "services": 8.0,
                    "nats_server": 2.0,
                    "client": 2.0,
                    "total": 12.0,
                    "by_process": {},
                },
            },
        },
        "throughput": {
            "1": {"1": level_point(40.0, 25.0)},
            "2": {"1": level_point(60.0, 20.0)},
        },
        "tool_scaling": [
            {
                "replicas": 1,
                "calls_per_s": 300.0,
                "ideal": 320.0,
                "p50_ms": 1,
                "p99_ms": 2,
                "calls": 320,
            },
            {
                "replicas": 4,
                "calls_per_s": 1020.0,
                "ideal": 1280.0,
                "p50_ms": 1,
                "p99_ms": 2,
                "calls": 1280,
            },
        ],
    }


def test_ratio_divides_and_is_missing_without_a_usable_base() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, 0.0) is None
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None


def test_each_target_is_judged_from_the_numbers_of_the_same_run() -> None:
    hop, run, scaling, *_ = targets(typed(results()))

    assert hop.measured == pytest.approx(1.25)
    assert hop.met is True  # the limit itself counts as met
    assert run.measured == pytest.approx(2.0)  # 3.6 ms / (18 hops x 0.1 ms)
    assert run.met is False
    assert scaling.measured == pytest.approx(3.4)
    assert scaling.met is False  # at least 3.5x is needed


def test_a_target_whose_numbers_are_missing_is_not_measured_rather_than_met() -> None:
    every = targets(Results(meta=msgspec.convert(META, Meta)))

    assert [t.verdict for t in every] == ["not measured"] * len(every)


def test_whole_run_rows_put_ratios_to_maf_and_to_the_floor_beside_the_numbers() -> None:
    maf, runbus = whole_run_rows(typed(results()))

    assert maf[0].startswith("MAF")
    assert runbus == [
        "runbus, six processes",
        "3.600",
        "9.000",
        "3.60x",
        "2.00x",
        "12.00",
        "12.00x",
    ]


def test_markdown_shows_each_ratio_next_to_the_absolute_number_it_comes_from() -> None:
    text = markdown(typed(results()))

    assert "| runbus Bus.request + Service | 0.125 | 1.25x | 0.600 | 1.50x |" in text
    assert "| per-hop overhead (p50) | 1.25x | ≤ 1.25x | met |" in text
    assert "| whole run vs hops x floor (p50) | 2.00x | ≤ 1.5x | **missed** |" in text
    # 2 gateways at 1 client: 60 runs/s, 1.5x one gateway, 0.075x MAF's 800 runs/s
    assert "| 2 | 1 | 60.0 | 1.50x | 0.07x | 20.0 | 40.0 |" in text
    assert "| 4 | 1020 | 3.40x | 1280 | 80% |" in text


def durable() -> dict[str, Any]:
    base = results()
    base["whole_run"]["runbus"]["cpu_ms_per_run"]["by_process"] = {"gateway#1": 6.0}
    base["throughput"]["1"]["64"] = {**level_point(90.0, 1.0), "cpu_ms_per_run": 9.0}
    base["throughput"]["2"]["64"] = level_point(120.0, 1.0)
    base["anchors"] = {
        "langgraph_memory": {
            "n": 300,
            "p50_ms": 8.0,
            "p99_ms": 9.0,
            "cpu_ms_per_run": 8.0,
            "runs_per_s": {"64": 100.0},
        },
        "langgraph_postgres": {
            "n": 300,
            "p50_ms": 25.0,
            "p99_ms": 30.0,
            "cpu_ms_per_run": 30.0,
            "cpu_ms_by_process": {"anchor": 20.0, "database": 10.0},
            "runs_per_s": {"64": 35.0},
            "cpu_ms_per_run_by_clients": {"1": 31.0, "64": 36.0},
        },
    }

    def level(rate: float, p50: float, failures: int = 0) -> dict[str, Any]:
        return {
            "runs": 100,
            "runs_per_s": rate,
            "failures": failures,
            "failure_kinds": ["unavailable: no gateway"] * failures,
            "p50_ms": p50,
            "p99_ms": p50,
            "cpu_ms_per_run": 1.0,
            "peak_rss_mib": {"x": 10.0},
        }

    base["slow_model"] = {
        "latency_ms": 300.0,
        "levels": [1, 1000],
        "runbus": {"1": level(0.8, 1260.0), "1000": level(60.0, 9000.0, failures=1)},
        "langgraph_memory": {"1": level(0.8, 1240.0), "1000": level(40.0, 9000.0)},
        "langgraph_postgres": {"1": level(0.8, 1250.0), "1000": level(16.0, 9000.0)},
    }
    base["session_length"] = {
        "runs": 100,
        "rounds": 3,
        "window_turns": 4,
        "windowed": {
            "run_ms": [30.0, 50.0],
            "first_ms": 30.0,
            "last_ms": 51.0,
            "last_over_first": 1.7,
        },
        "persisted": {
            "run_ms": [30.0, 33.0],
            "first_ms": 30.0,
            "last_ms": 33.0,
            "last_over_first": 1.1,
        },
    }
    base["rss_mib"] = {
        "history": 50.0,
        "memory": 130.0,
        "compaction": 50.0,
        "model_router": 80.0,
        "tool_executor": 50.0,
        "gateway#1": 60.0,
        "nats-server": 30.0,
    }
    return base


def test_durable_targets_compare_with_langgraph_measured_in_the_same_run() -> None:
    cpu, cpu64, rate, slow, overhead, session, memory, stack = durable_targets(typed(durable()))

    assert cpu.measured == pytest.approx(12.0 / 30.0)
    assert cpu.met is True
    assert cpu64.measured == pytest.approx(9.0 / 36.0)  # 1 gateway, over the 64-client rounds
    assert cpu64.met is True
    assert rate.measured == pytest.approx(120.0 / 35.0)  # the better gateway count
    assert "(2 gateway(s))" in rate.basis
    assert slow.measured == pytest.approx(60.0 / 16.0)
    assert slow.met is False  # 3.75x, but a run failed
    assert overhead.measured == pytest.approx(60.0 / 40.0)  # beyond 4 x 300 ms
    assert overhead.met is False
    assert session.measured == pytest.approx(1.1)
    assert session.met is True
    assert memory.measured == 130.0
    assert memory.met is False
    assert stack.measured == pytest.approx(420.0)  # nats-server not counted
    assert stack.met is True


def test_markdown_says_why_a_durable_target_was_missed_and_plots_are_listed() -> None:
    text = markdown(typed(durable()))

    assert "| memory service RSS, no agent using memory | 130 MiB | ≤ 120 MiB | **missed** |" in (
        text
    )
    assert "## Missed targets: why, and what would close them" in text
    assert "LangGraph + Postgres (fsync, synchronous_commit on)" in text
    assert "| 35 | 31.0 / 36.0 | 1.00x | 1.00x |" in text  # CPU at 1 / 64 clients, its ratios
    assert "| 40 / 90 | 9.000 | 0.40x | 0.25x |" in text  # runbus: only 64 clients measured
    assert "| 1000 | runbus, six processes | 60.0 | 1 |" in text
    assert "runbus, six processes at 1000 in flight**: 1 of" in text  # its failures explained


def test_counts_that_were_not_measured_print_as_unknown_never_as_none() -> None:
    measured = durable()
    del measured["whole_run"]["hops_per_run"], measured["whole_run"]["events_per_run"]

    text = markdown(typed(measured))

    assert "None" not in text
    assert "Per run: ? request/reply hops and ? run events" in text
    assert "| whole run vs hops x floor (p50) | - | ≤ 1.5x | not measured |" in text


def test_markdown_shows_a_runs_messages_by_kind_and_hop_subject() -> None:
    measured = durable()
    measured["whole_run"]["messages"] = {
        "runs": 20,
        "by_kind": {"run requests": 1.0, "request/reply hops": 18.0, "run events": 10.0},
        "hops_by_subject": {"runbus.history.append": 4.0, "runbus.model.complete": 4.0},
        "kv_and_other_by_subject": {"$KV.RUNBUS_SESSIONS.…": 4.0},
    }

    text = markdown(typed(measured))

    assert "1 run requests, 18 request/reply hops, 10 run events" in text
    assert "`runbus.history.append` 4, `runbus.model.complete` 4" in text
    assert "KV writes and other messages: `$KV.RUNBUS_SESSIONS.…` 4" in text


def test_markdown_says_what_bounds_a_level_and_where_one_runs_overhead_goes() -> None:
    measured = durable()
    top = measured["slow_model"]["runbus"]["1000"]
    top["rounds_runs_per_s"] = [55.0, 60.0, 62.0]
    top["cores_by_process"] = {"model_router": 0.8, "gateway#1": 0.2, "client": 0.1}
    top["model_server"] = {
        "cores": 0.1,
        "cpu_ms_per_call": 0.4,
        "late_p99_ms": 2.0,
        "body_p99_ms": 300.0,
        "lag_p99_ms": 1.5,
        "lag_max_ms": 3.0,
        "calls": 4000,
    }
    measured["overhead"] = {
        "runs": 20,
        "traced": 20,
        "latency_ms": 300.0,
        "overhead_p50_ms": 60.0,
        "parts_ms": {"model call beyond the model's latency (HTTP)": 24.0},
        "model_server": {"late_p50_ms": 1.0, "cpu_ms_per_call": 0.4},
    }

    text = markdown(typed(measured))

    assert (
        "| 1000 | runbus, six processes | 55.0 / 60.0 / 62.0 | 0.10 | 0.400 | 2.000 | 300.0 "
        "| 1.500 "
        "| model_router 0.80, gateway#1 0.20, client 0.10 |"
    ) in text
    assert "the busiest process, model_router, at 0.80 cores (73% of runbus's)" in text
    assert "The model server: 0.10 cores, 0.400 ms CPU per call, answered p99 2.000 ms" in text
    assert "| model call beyond the model's latency (HTTP) | 24.0 | 40% |" in text
    assert "the largest parts of runbus's overhead per run are model call beyond" in text


def test_a_missed_cpu_target_is_explained_with_the_cost_where_requests_overlap() -> None:
    measured = durable()
    measured["whole_run"]["runbus"]["cpu_ms_per_run"]["total"] = 27.0  # 0.9x: missed
    measured["whole_run"]["messages"] = {
        "runs": 20,
        "by_kind": {"request/reply hops": 10.0, "run events": 10.0, "KV writes": 9.0},
        "hops_by_subject": {},
        "kv_and_other_by_subject": {},
    }

    text = markdown(typed(measured))

    assert "| CPU per run vs LangGraph + Postgres, runs one at a time | 0.90x |" in text
    assert "| CPU per run vs LangGraph + Postgres, 64 clients | 0.25x |" in text
    assert "A run puts 29 messages on the services' bus" in text
    assert "cost 9.000 ms each (LangGraph + Postgres 36.0 ms)" in text


def test_results_json_renders_the_same_report_after_a_round_trip() -> None:
    measured = typed(durable())

    assert markdown(decode(encode(measured))) == markdown(measured)


@pytest.mark.parametrize(
    ("section", "field"),
    [("floor", "request_reply"), ("maf", "runs_per_s"), ("session_length", "window_turns")],
)
def test_a_section_missing_a_field_is_refused_before_anything_is_rendered(
    section: str, field: str
) -> None:
    measured = durable()
    del measured[section][field]

    with pytest.raises(msgspec.ValidationError, match=f"missing required field `{field}`"):
        typed(measured)


def test_held_deltas_show_first_byte_and_completion_of_held_next_to_streamed() -> None:
    measured = {
        "meta": META,
        "held_deltas": {
            "words": 60,
            "pace_ms": 20.0,
            "runs": 10,
            "streamed_first_ms": 35.0,
            "streamed_completed_ms": 1300.0,
            "held_first_ms": 1290.0,
            "held_completed_ms": 1313.0,
        },
    }

    text = markdown(typed(measured))

    assert "| streamed (no output guardrails) | 35.0 | 1300.0 |" in text
    assert "| held until output guardrails pass | 1290.0 | 1313.0 |" in text
    assert "`run.completed` comes +13.0 ms from the streamed run's (1.01x of it)" in text


def test_an_mcp_tool_run_is_judged_against_the_native_run_of_the_same_bench() -> None:
    measured = {
        "meta": META,
        "mcp_tool": {
            "runs": 20,
            "native_p50_ms": 10.0,
            "mcp_p50_ms": 25.0,
            "ratio": 2.5,
            "call_native_p50_ms": 0.4,
            "call_mcp_p50_ms": 1.6,
        },
    }

    text = markdown(typed(measured))

    assert (
        "| MCP stdio tool call vs native, whole run (p50) | 2.50x | ≤ 2x | **missed** | run "
        "with an MCP call 25.0 ms / with a native call 10.0 ms (20 runs each, interleaved); "
        "the bare call on the bus 1.600 ms / 0.400 ms |"
    ) in text
