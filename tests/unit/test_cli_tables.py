"""List commands print a header row and columns as wide as their widest cell."""

from runbus.render import table


def test_a_long_id_widens_its_column_instead_of_shifting_the_next_ones() -> None:
    lines = table(
        ("RUN", "STATUS", "RESULT"),
        [["r-1", "completed", "ok"], ["r-" + "f" * 30, "failed", "[timeout] too slow"]],
    ).splitlines()

    assert lines[0].startswith("RUN ")
    starts = {
        line.index(word)
        for line, word in zip(lines, ("STATUS", "completed", "failed"), strict=True)
    }
    assert len(starts) == 1
    assert {
        line.index(word) for line, word in zip(lines, ("RESULT", "ok", "[timeout]"), strict=True)
    } == {len("r-" + "f" * 30) + 2 + len("completed") + 2}


def test_with_no_rows_the_header_alone_is_printed_and_no_line_ends_in_spaces() -> None:
    assert table(("SESSION", "AGENT", "RUNNING"), []) == "SESSION  AGENT  RUNNING"
    assert not table(("A", "B"), [["x", ""]]).endswith(" ")
