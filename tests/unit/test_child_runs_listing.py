"""`runbus runs list` shows each run's child runs (the agents it called) under it."""

from datetime import UTC, datetime

from runbus.commands.runs import _row, nested
from runbus.messages.runs import RunRecord

AT = datetime(2026, 12, 4, 9, 30, tzinfo=UTC)


def record(run_id: str, parent: str = "", depth: int = 0) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        agent="triage",
        session_id="s1",
        tenant="acme",
        user_id="alice",
        status="completed",
        created_at=AT,
        updated_at=AT,
        parent_run_id=parent,
        root_run_id="r-a" if parent else "",
        depth=depth,
    )


def test_children_follow_their_parent_in_order_and_an_orphan_stands_on_its_own() -> None:
    records = [
        record("r-b"),
        record("r-a-2", "r-a", 1),
        record("r-a"),
        record("r-a-1", "r-a", 1),
        record("r-a-1-x", "r-a-1", 2),
        record("r-gone-1", "r-gone", 1),
    ]

    ordered = [r.run_id for r in nested(records)]

    assert ordered == ["r-b", "r-a", "r-a-2", "r-a-1", "r-a-1-x", "r-gone-1"]


def test_a_child_listed_with_its_parent_is_indented_by_its_depth() -> None:
    listed = frozenset({"r-a", "r-a-1"})

    assert _row(record("r-a-1", "r-a", 1), listed)[0] == "  └ r-a-1"
    assert _row(record("r-gone-1", "r-gone", 1), listed)[0] == "r-gone-1"
    assert _row(record("r-a"), listed)[0] == "r-a"
