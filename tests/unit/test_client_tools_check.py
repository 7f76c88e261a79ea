"""What a run may bring as the client's own tools: refused for an agent that takes none, and
bounded in count, name, size and clashes with the agent's tools."""

import pytest

from runbus.errors import BadRequest
from runbus.messages import ToolSpec
from runbus_gateway.run.toolsets import ClientToolsRefused, check_client_tools


def spec(name: str, size: int = 0) -> ToolSpec:
    return ToolSpec(name=name, description="x" * size, parameters={"type": "object"})


def test_no_client_tools_pass_for_any_agent() -> None:
    check_client_tools("travel", False, ["get_weather"], [])


def test_an_agent_that_takes_none_refuses_them_naming_each() -> None:
    with pytest.raises(ClientToolsRefused) as refused:
        check_client_tools("travel", False, [], [spec("local_weather"), spec("camera")])

    assert refused.value.code == "bad_request"
    assert "'travel'" in refused.value.message
    assert "'local_weather', 'camera'" in refused.value.message


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        ([spec(f"t{n}") for n in range(33)], "at most 32"),
        ([spec("runbus.tools.x")], "is not [A-Za-z0-9_-]{1,64}"),
        ([spec("a" * 65)], "is not [A-Za-z0-9_-]{1,64}"),
        ([spec("big", 17 * 1024)], "larger than 16384 bytes"),
        ([spec("dup"), spec("dup")], "distinct"),
        ([spec("get_weather")], "names of the agent's own tools"),
    ],
)
def test_unsafe_client_tools_are_bad_requests(specs: list[ToolSpec], says: str) -> None:
    with pytest.raises(BadRequest) as refused:
        check_client_tools("travel", True, ["get_weather", "memory_search"], specs)

    assert not isinstance(refused.value, ClientToolsRefused)
    assert says in refused.value.message


def test_safe_client_tools_pass_for_an_agent_that_takes_them() -> None:
    check_client_tools("device", True, ["get_weather"], [spec("local_weather"), spec("camera")])
