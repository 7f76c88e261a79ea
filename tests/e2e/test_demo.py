"""`make run` runs `runbus demo`: it must work from nothing and print the conversation."""

import os
import subprocess
import sys
from pathlib import Path

RUNBUS = str(Path(sys.executable).parent / "runbus")


def test_demo_runs_the_conversation_on_a_fresh_data_dir_and_exits_zero(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNBUS_", "OTEL_"))}
    env["RUNBUS_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [RUNBUS, "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "→ get_weather" in out
    assert "→ search_flights" in out
    assert "→ create_booking" in out
    assert "confirmation RB-" in out
    # The guardrail answered the password line itself: no tool, no model.
    refusal = out.split("hunter2")[1].split("demo-second")[0]
    assert "Please don't share passwords" in refusal
    assert "→" not in refusal
    # The second session recalls the preference stated in the first (long-term memory).
    assert "window seat" in out.split("demo-second")[1]
    # The corporate policy stopped the VA823 booking: no model call after it.
    blocked = out.split("VA823 on Friday")[1]
    assert "not covered by the company's travel agreement" in blocked
    assert (tmp_path / "data" / "logs" / "gateway.log").exists()


def test_demo_whose_runs_fail_exits_non_zero_saying_how_many(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNBUS_", "OTEL_"))}
    env["RUNBUS_DATA_DIR"] = str(tmp_path / "data")
    # No agent files: every turn asks for a `travel` agent the gateway does not have.
    (tmp_path / "no-agents").mkdir()
    env["RUNBUS_AGENTS_DIR"] = str(tmp_path / "no-agents")
    done = subprocess.run(
        [RUNBUS, "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert "unknown_agent" in done.stdout
    assert done.stdout.rstrip().endswith("runbus demo: 6 of 6 runs failed")
