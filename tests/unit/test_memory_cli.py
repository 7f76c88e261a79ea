"""`runbus memory`: what the arguments ask for, and how a memory reads for a person."""

from datetime import UTC, datetime

import pytest

from runbus.cli import build_parser
from runbus.commands.memory import forget_request, rows
from runbus.messages.memory import MemoryForget, MemoryHit


def parse(*argv: str) -> MemoryForget:
    return forget_request(build_parser().parse_args(["memory", "forget", *argv]))


def test_forget_takes_ids_a_session_or_everything() -> None:
    assert parse("m1", "m2") == MemoryForget(memory_ids=["m1", "m2"])
    assert parse("--session", "s1") == MemoryForget(session_id="s1")
    assert parse("--all") == MemoryForget(everything=True)


@pytest.mark.parametrize("argv", [(), ("m1", "--all"), ("--session", "s1", "--all")])
def test_forget_without_exactly_one_choice_stops_before_sending_anything(
    argv: tuple[str, ...],
) -> None:
    with pytest.raises(SystemExit, match="give memory ids, --session S, or --all"):
        parse(*argv)


def test_memories_read_as_a_table_of_date_session_id_and_text_under_a_header() -> None:
    hit = MemoryHit(
        memory_id="6f1c2a4e-8a0b-5c1e-9d3f-0a1b2c3d4e5f",
        text="I always want a window seat.",
        score=0.83,
        session_id="s1",
        created_at=datetime(2026, 3, 1, 9, 30, tzinfo=UTC),
    )

    assert rows([hit]).splitlines() == [
        "CREATED           SESSION  MEMORY                                TEXT",
        "2026-03-01 09:30  s1       6f1c2a4e-8a0b-5c1e-9d3f-0a1b2c3d4e5f  "
        "I always want a window seat.",
    ]
    assert rows([hit], scored=True).splitlines()[1].startswith("0.83   2026-03-01")


def test_an_audit_listing_says_which_memory_replaced_a_superseded_one() -> None:
    when = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    old = MemoryHit(
        memory_id="m-sydney",
        text="I live in Sydney.",
        score=0.0,
        session_id="s1",
        created_at=when,
        status="superseded",
        superseded_by="m-perth",
        retired_at=when,
    )
    new = MemoryHit(
        memory_id="m-perth", text="I moved to Perth.", score=0.0, session_id="s2", created_at=when
    )
    listing = build_parser().parse_args(["memory", "list", "--retired"])

    lines = rows([new, old], audit=listing.retired).splitlines()

    assert lines[0].split() == ["CREATED", "SESSION", "MEMORY", "STATUS", "TEXT"]
    assert lines[1].split()[3:] == ["m-perth", "active", "I", "moved", "to", "Perth."]
    assert "superseded by m-perth  I live in Sydney." in lines[2]
