"""Agents as tools without a bus: the child's id, the input check, and the depth and fan-out
limits, each a typed error the model reads (the child is then never started)."""

import asyncio

import pytest

from runbus.headers import RunContext
from runbus.messages import (
    FunctionCallContent,
    RunCompleted,
    RunFailed,
    RunRequest,
    Usage,
    is_identifier,
)
from runbus_gateway.agents import AgentTool
from runbus_gateway.run.agent_tools import MAX_DEPTH, MAX_FAN_OUT, AgentTools, child_run_id
from tests.helpers import eventually


class HeldChildren:
    """Child runs that answer once `release` is set; what was started."""

    def __init__(self) -> None:
        self.started: list[RunRequest] = []
        self.release = asyncio.Event()

    async def call_agent(
        self, ctx: RunContext, request: RunRequest, tool: str, *, first_send: bool
    ) -> RunCompleted | RunFailed:
        self.started.append(request)
        await self.release.wait()
        usage = Usage(input_tokens=3, output_tokens=2)
        return RunCompleted(run_id=request.run_id, response=[], text="done", usage=usage)


def tools(children: HeldChildren, *, depth: int = 0) -> AgentTools:
    props = {"tenant": "acme", "user_id": "alice"}
    if depth:
        props |= {"depth": str(depth), "root_run_id": "r-root", "parent_run_id": "r-up"}
    ctx = RunContext(run_id="r-parent", session_id="s1", agent="triage", props=props)
    return AgentTools([AgentTool(agent="flights")], children, ctx, set(), None)


def ask(call_id: str, **arguments: object) -> FunctionCallContent:
    return FunctionCallContent(call_id=call_id, name="flights", arguments=arguments)


@pytest.mark.parametrize("parent", ["r-1", "r-" + "x" * 126])
@pytest.mark.parametrize("call_id", ["c-1", "call 1 / with.dots", "é" * 300])
def test_a_child_run_id_is_an_identifier_and_the_same_for_the_same_call(
    parent: str, call_id: str
) -> None:
    child = child_run_id(parent, call_id)

    assert is_identifier(child)
    assert child == child_run_id(parent, call_id)
    assert child != child_run_id(parent, call_id + "x")
    assert child.startswith(parent[:96])


async def test_the_child_gets_the_parents_tree_and_its_usage_rolls_up() -> None:
    children = HeldChildren()
    children.release.set()
    agent_tools = tools(children, depth=2)

    invoked = await agent_tools.call(ask("c-1", input="SYD to MEL"), first_send=True)

    [request] = children.started
    assert (request.parent_run_id, request.root_run_id, request.depth) == ("r-parent", "r-root", 3)
    assert request.session_id == request.run_id == child_run_id("r-parent", "c-1")
    assert invoked.result.result == "done"
    assert agent_tools.usage == Usage(input_tokens=3, output_tokens=2)


async def test_a_call_past_the_depth_limit_is_a_typed_error_and_starts_nothing() -> None:
    children = HeldChildren()

    invoked = await tools(children, depth=MAX_DEPTH).call(ask("c-1", input="x"), first_send=True)

    assert invoked.result.error is not None
    assert invoked.result.error.startswith("agent_call_depth: ")
    assert children.started == []


async def test_a_call_past_the_fan_out_limit_is_a_typed_error_while_the_others_wait() -> None:
    children = HeldChildren()
    agent_tools = tools(children)
    waiting = [
        asyncio.ensure_future(agent_tools.call(ask(f"c-{i}", input="x"), first_send=True))
        for i in range(MAX_FAN_OUT)
    ]
    await eventually(lambda: len(children.started) == MAX_FAN_OUT)

    refused = await agent_tools.call(ask("c-over", input="x"), first_send=True)
    children.release.set()
    answered = await asyncio.gather(*waiting)

    assert refused.result.error is not None
    assert refused.result.error.startswith("agent_call_fan_out: ")
    assert [a.result.result for a in answered] == ["done"] * MAX_FAN_OUT
    assert agent_tools.in_flight == 0


async def test_a_call_without_input_is_refused_before_any_child() -> None:
    children = HeldChildren()

    invoked = await tools(children).call(ask("c-1"), first_send=True)

    assert invoked.result.error == "invalid_arguments: `input` must be the text to ask the agent"
    assert children.started == []
