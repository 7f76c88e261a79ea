"""`runbus run` says what a quiet run waits on, so a slow model or tool is not taken for a hang."""

import asyncio
import io

import pytest

from runbus.messages import FunctionCallContent, RunStarted, RunToolCall
from runbus.render import WaitNotice, waiting_on
from tests.helpers import eventually

CALL = RunToolCall(
    run_id="r-1", call=FunctionCallContent(call_id="c1", name="get_weather", arguments={})
)


@pytest.mark.parametrize(
    ("event", "said"),
    [
        (None, "waiting for the run to start (a gateway to take it)"),
        (RunStarted(run_id="r-1", agent="travel", session_id="s1"), "waiting for the model"),
        (CALL, "waiting for tool get_weather"),
    ],
)
def test_what_a_run_waits_on_follows_its_last_event(event: object, said: str) -> None:
    assert waiting_on(event) == said  # type: ignore[arg-type]


async def test_a_quiet_run_is_said_to_wait_on_its_tool_with_the_time_it_has_waited() -> None:
    out = io.StringIO()
    notice = WaitNotice(out, every=0.05)
    notice.saw(CALL)
    ticking = asyncio.ensure_future(notice.run())
    try:
        await eventually(lambda: "waiting for tool get_weather (" in out.getvalue())
    finally:
        ticking.cancel()

    assert out.getvalue().startswith("  … waiting for tool get_weather (")
