"""The run context every hop forwards in NATS headers: ids, trusted props and the deadline."""

import time

import pytest

from runbus import headers as h
from runbus.headers import RunContext

CTX = RunContext(
    run_id="r-7f3a",
    session_id="s1",
    agent="travel",
    props={"user_id": "alice", "tenant": "acme", "request_id": "r-7f3a"},
    deadline=1_767_225_600.25,
)


def test_run_context_survives_a_trip_through_headers() -> None:
    assert RunContext.from_headers(CTX.to_headers()) == CTX


def test_run_context_is_written_under_the_documented_header_names() -> None:
    assert CTX.to_headers() == {
        "rb-run-id": "r-7f3a",
        "rb-session-id": "s1",
        "rb-agent": "travel",
        "rb-prop-user_id": "alice",
        "rb-prop-tenant": "acme",
        "rb-prop-request_id": "r-7f3a",
        "rb-deadline": "1767225600.250",
    }


def test_empty_run_context_writes_no_headers() -> None:
    assert RunContext().to_headers() == {}


def test_only_rb_prop_headers_become_trusted_properties() -> None:
    ctx = RunContext.from_headers(
        {
            "rb-prop-user_id": "alice",
            "rb-auth": "Bearer dev-bob",
            "user_id": "mallory",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        }
    )

    assert ctx.props == {"user_id": "alice"}
    assert ctx.prop("user_id") == "alice"


def test_an_unset_property_reads_as_empty() -> None:
    assert CTX.prop("role") == ""


@pytest.mark.parametrize("headers", [None, {}])
def test_no_headers_give_an_empty_context_without_deadline(
    headers: dict[str, str] | None,
) -> None:
    ctx = RunContext.from_headers(headers)

    assert ctx == RunContext()
    assert ctx.time_left() is None


@pytest.mark.parametrize("raw", ["soon", "", "12:00", "nan"])
def test_a_deadline_header_that_is_not_a_time_is_ignored(raw: str) -> None:
    ctx = RunContext.from_headers({h.RUN_ID: "r-1", h.DEADLINE: raw})

    assert ctx.deadline is None
    assert ctx.time_left() is None
    assert ctx.run_id == "r-1"


def test_time_left_counts_down_to_the_deadline() -> None:
    ctx = RunContext.from_headers({h.DEADLINE: f"{time.time() + 30:.3f}"})

    left = ctx.time_left()

    assert left is not None
    assert 29 < left <= 30.01


def test_time_left_is_negative_once_the_deadline_passed() -> None:
    left = RunContext(deadline=time.time() - 5).time_left()

    assert left is not None
    assert left < -4
