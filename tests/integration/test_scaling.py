"""Replicas of a service share its queue group; losing one between runs loses nothing."""

from nats.aio.client import Client as NATS

from runbus_examples.travel import tools as travel_tools
from runbus_tool_executor.service import ToolExecutorService
from tests.helpers import publish_and_collect, raw_request
from tests.stack import Stack

CITIES = "Sydney, Melbourne, Perth, Hobart, Darwin, Cairns, Tokyo, Paris, London and Auckland"


def _handled(service: ToolExecutorService) -> int:
    assert service._micro is not None
    return sum(e.num_requests for e in service._micro.stats().endpoints)


async def test_two_tool_executor_replicas_share_work_and_one_can_go(stack: Stack, nc: NATS) -> None:
    first = stack.services["tool_executor"]
    assert isinstance(first, ToolExecutorService)
    second = await stack.start_service(ToolExecutorService, registries=[travel_tools])
    assert isinstance(second, ToolExecutorService)

    for n in range(3):
        events = await publish_and_collect(
            nc, f"r-scale-{n}", raw_request(f"r-scale-{n}", f"Weather in {CITIES}?")
        )
        assert events[-1]["type"] == "run.completed"

    # 30 calls at random between two members: both get some unless p = 2 * 2**-30.
    assert _handled(first) > 0
    assert _handled(second) > 0

    await first.stop()
    events = await publish_and_collect(
        nc, "r-after-stop", raw_request("r-after-stop", "Weather in Sydney?")
    )
    assert events[-1]["type"] == "run.completed"
    assert "Sydney" in events[-1]["text"]
