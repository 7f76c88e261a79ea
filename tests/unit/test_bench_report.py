"""bench/report.py: the ratios, the target verdicts and the tables `make bench` writes."""

from typing import Any

import pytest
from bench.report import markdown, ratio, targets, whole_run_rows


def results() -> dict[str, Any]:
    return {
        "meta": {"timestamp": "t", "commit": "abc1234", "machine": {"cpus": 2}},
        "floor": {
            "request_reply": {"p50_ms": 0.1, "p99_ms": 0.4},
            "js_publish": {"p50_ms": 0.05, "p99_ms": 0.2},
        },
        "hop": {"runbus": {"p50_ms": 0.125, "p99_ms": 0.6}},
        "maf": {
            "p50_ms": 1.0,
            "p99_ms": 2.0,
            "cpu_ms_per_run": 1.0,
            "runs_per_s": {"1": 800.0, "64": 1000.0},
        },
        "whole_run": {
            "hops_per_run": 18,
            "events_per_run": 10,
            "runbus": {"p50_ms": 3.6, "p99_ms": 9.0, "cpu_ms_per_run": {"total": 12.0}},
        },
        "throughput": {
            "1": {"1": {"runs_per_s": 40.0, "p50_ms": 25.0, "p99_ms": 50.0}},
            "2": {"1": {"runs_per_s": 60.0, "p50_ms": 20.0, "p99_ms": 40.0}},
        },
        "tool_scaling": [
            {"replicas": 1, "calls_per_s": 300.0, "ideal": 320.0, "p50_ms": 1, "p99_ms": 2},
            {"replicas": 4, "calls_per_s": 1020.0, "ideal": 1280.0, "p50_ms": 1, "p99_ms": 2},
        ],
    }


def test_ratio_divides_and_is_missing_without_a_usable_base() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, 0.0) is None
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None


def test_each_target_is_judged_from_the_numbers_of_the_same_run() -> None:
    hop, run, scaling = targets(results())

    assert hop.measured == pytest.approx(1.25)
    assert hop.met is True  # the limit itself counts as met
    assert run.measured == pytest.approx(2.0)  # 3.6 ms / (18 hops x 0.1 ms)
    assert run.met is False
    assert scaling.measured == pytest.approx(3.4)
    assert scaling.met is False  # at least 3.5x is needed


def test_a_target_whose_numbers_are_missing_is_not_measured_rather_than_met() -> None:
    hop, run, scaling = targets({"floor": {"request_reply": {"p50_ms": 0.1}}})

    assert [t.verdict for t in (hop, run, scaling)] == ["not measured"] * 3


def test_whole_run_rows_put_ratios_to_maf_and_to_the_floor_beside_the_numbers() -> None:
    maf, runbus = whole_run_rows(results())

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
    text = markdown(results())

    assert "| runbus Bus.request + Service | 0.125 | 1.25x | 0.600 | 1.50x |" in text
    assert "| per-hop overhead (p50) | 1.25x | ≤ 1.25x | met |" in text
    assert "| whole run vs hops x floor (p50) | 2.00x | ≤ 1.5x | **missed** |" in text
    # 2 gateways at 1 client: 60 runs/s, 1.5x one gateway, 0.075x MAF's 800 runs/s
    assert "| 2 | 1 | 60.0 | 1.50x | 0.07x | 20.0 | 40.0 |" in text
    assert "| 4 | 1020 | 3.40x | 1280 | 80% |" in text
