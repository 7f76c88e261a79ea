"""The test suite's own rule: tests wait for facts, never for time. Only `tests/helpers.py`
sleeps (`eventually` between looks, `take_time` for time that must pass on purpose)."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SLEEP = re.compile(r"\bsleep\((?!0\))")
"""A sleep of any length but zero (`sleep(0)` only yields to other tasks)."""


def test_no_test_sleeps_outside_the_helpers() -> None:
    sleeping = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != "helpers.py" or path.parent != TESTS
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SLEEP.search(line) and path != Path(__file__).resolve()
    ]

    assert sleeping == [], "wait with tests.helpers.eventually instead:\n" + "\n".join(sleeping)
