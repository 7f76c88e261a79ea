"""Which failed tool calls the gateway sends again, and when it gives the model the error."""

import pytest

from runbus.errors import IdleTimeout, RemoteError, Unavailable
from runbus_gateway.tool_calls import TOOL_RETRY_PAUSES, tool_retry_pause

LOST = IdleTimeout("runbus.tools.get_weather.invoke", 30, "RUNBUS_REQUEST_TIMEOUT")
NATS_SLOW_AT_THE_EXECUTOR = RemoteError("unavailable", "NATS did not answer in time")


@pytest.mark.parametrize("lost", [LOST, NATS_SLOW_AT_THE_EXECUTOR])
def test_a_call_lost_on_the_way_goes_again_a_bounded_number_of_times(lost: Exception) -> None:
    pauses = [tool_retry_pause(lost, tries, None) for tries in range(1, 5)]

    assert pauses == [0.2, 1.0, None, None]


@pytest.mark.parametrize(
    "refused",
    [
        Unavailable("no service answers on 'runbus.tools.gone.invoke'"),
        RemoteError("bad_request", "invalid request body"),
        RemoteError("unknown_tool", "no tool named 'x'"),
        RemoteError("internal", "internal error (KeyError); see the service log"),
    ],
)
def test_a_tool_that_is_gone_or_refused_the_call_is_the_models_at_once(
    refused: Exception,
) -> None:
    assert tool_retry_pause(refused, 1, None) is None


def test_no_try_again_when_the_run_has_no_time_for_the_pause() -> None:
    assert tool_retry_pause(LOST, 1, TOOL_RETRY_PAUSES[0] / 2) is None
    assert tool_retry_pause(LOST, 1, 60.0) == TOOL_RETRY_PAUSES[0]
