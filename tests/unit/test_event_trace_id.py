"""The trace id a run event's headers name: the W3C `traceparent`'s, read as OpenTelemetry's
propagator reads it, and empty (never an exception) when the header is absent or malformed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from runbus.telemetry import traceparent_trace_id

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
W3C = TraceContextTextMapPropagator()


def _propagators_trace_id(headers: dict[str, str]) -> str:
    context = trace.get_current_span(W3C.extract(headers)).get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else ""


def test_a_traceparent_names_its_trace_id_sampled_or_not() -> None:
    assert traceparent_trace_id({"traceparent": TRACEPARENT, "rb-run-id": "r-1"}) == TRACE_ID
    assert traceparent_trace_id({"traceparent": TRACEPARENT[:-2] + "00"}) == TRACE_ID
    # A later version may add fields.
    assert traceparent_trace_id({"traceparent": "01" + TRACEPARENT[2:] + "-more"}) == TRACE_ID


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"rb-run-id": "r-1"},
        {"traceparent": ""},
        {"traceparent": "garbage"},
        {"traceparent": "ff" + TRACEPARENT[2:]},  # the version W3C forbids
        {"traceparent": f"00-{'0' * 32}-b7ad6b7169203331-01"},  # the invalid trace id
        {"traceparent": f"00-{TRACE_ID}-{'0' * 16}-01"},  # the invalid span id
        {"traceparent": TRACEPARENT.upper()},
        {"traceparent": TRACEPARENT[:-1]},
        {"traceparent": TRACEPARENT + "-extra"},  # version 00 has exactly four fields
        {"traceparent": TRACEPARENT + " " * 500},  # longer than a traceparent may be
        {"Traceparent": TRACEPARENT},  # NATS header names are case-sensitive
    ],
)
def test_no_or_a_malformed_traceparent_names_no_trace(headers: dict[str, str] | None) -> None:
    assert traceparent_trace_id(headers) == ""


HEX = "0123456789abcdef"
NEAR_HEX = HEX + "AF-g "


def _field(length: int) -> st.SearchStrategy[str]:
    """A field of the right length mostly, sometimes all zeros, a digit short or long, or
    with a character that does not belong."""
    return (
        st.text(HEX, min_size=length, max_size=length)
        | st.just("0" * length)
        | st.text(NEAR_HEX, min_size=length - 1, max_size=length + 1)
    )


TRACEPARENTS = st.text() | st.builds(
    lambda pad, version, trace_id, span_id, flags, extra, end: (
        f"{pad}{version}-{trace_id}-{span_id}-{flags}{extra}{end}"
    ),
    st.sampled_from(["", " ", "\t"]),
    st.sampled_from(["00", "01", "cc", "ff", "0", "0A"]),
    _field(32),
    _field(16),
    _field(2),
    st.sampled_from(["", "-", "-x", "-00-more", " -x"]),
    st.sampled_from(["", " ", "\t", "\n", "x"]),
)


@settings(max_examples=500, deadline=None)
@given(TRACEPARENTS)
def test_any_traceparent_names_the_trace_the_propagator_finds_in_it(value: str) -> None:
    headers = {"traceparent": value}

    assert traceparent_trace_id(headers) == _propagators_trace_id(headers)
