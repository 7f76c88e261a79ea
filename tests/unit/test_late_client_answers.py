"""A client tool's answer that comes when the run has too little of its deadline left to go
on gives the delivery back (a new one, with a deadline of its own, reads the stored answer);
one read at once, or in a run whose whole timeout is that short, does not."""

import pytest

from runbus import headers
from runbus.errors import Unavailable
from runbus.headers import RunContext
from runbus.messages import FunctionCallContent, FunctionResultContent
from runbus_gateway.run.late import RESUME_WITHIN
from runbus_gateway.run.toolsets import ClientTools

CALL = FunctionCallContent(call_id="c1", name="pick_seat", arguments={})


class Clock:
    now = 1_000.0

    def time(self) -> float:
        return self.now


class AnsweringClient:
    """Answers after `takes` seconds of the run's clock."""

    def __init__(self, clock: Clock, takes: float) -> None:
        self.clock = clock
        self.takes = takes

    async def await_client(
        self, ctx: RunContext, call: FunctionCallContent
    ) -> FunctionResultContent:
        self.clock.now += self.takes
        return FunctionResultContent(call_id=call.call_id, result="14A")


def tools(clock: Clock, timeout: float, takes: float) -> ClientTools:
    ctx = RunContext(run_id="r1", deadline=clock.now + timeout)
    return ClientTools([], AnsweringClient(clock, takes), ctx, set(), None)  # type: ignore[arg-type]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(headers, "time", clock)
    return clock


async def test_an_answer_that_leaves_too_little_of_the_deadline_hands_the_delivery_back(
    clock: Clock,
) -> None:
    with pytest.raises(Unavailable, match="its client"):
        await tools(clock, timeout=300, takes=300 - RESUME_WITHIN + 1).call(CALL, first_send=True)


async def test_an_answer_with_time_to_spare_or_read_at_once_goes_on_in_the_same_delivery(
    clock: Clock,
) -> None:
    early = await tools(clock, timeout=300, takes=60).call(CALL, first_send=True)
    # A run whose whole timeout is under the margin would hand back forever: it goes on.
    short = await tools(clock, timeout=RESUME_WITHIN / 2, takes=1).call(CALL, first_send=True)

    assert early.result.result == "14A"
    assert short.result.result == "14A"
