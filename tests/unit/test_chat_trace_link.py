"""`/trace` in `runbus chat` links the run's trace in the UI that RUNBUS_JAEGER_URL names."""

import pytest

from runbus.commands.chat import trace_link

TRACE = "4a06d1e3a90c37664e490d5510509ae0"


@pytest.mark.parametrize(
    ("ui", "link"),
    [
        ("http://localhost:16686", f"http://localhost:16686/trace/{TRACE}"),
        ("http://localhost:16686/", f"http://localhost:16686/trace/{TRACE}"),
        ("http://phoenix:6006/traces/{trace_id}", f"http://phoenix:6006/traces/{TRACE}"),
    ],
)
def test_the_trace_link_is_jaegers_page_or_the_template_filled_in(ui: str, link: str) -> None:
    assert trace_link(ui, TRACE) == link
