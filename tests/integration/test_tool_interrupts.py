"""A tool asks the run's owner a question mid-call (`runbus.interrupts.interrupt`): the run
waits as for an approval, the question in its events; the owner's answer (approve with a note)
calls the tool again, which reads it; a declined question is an error the model reads; a tool
that changes things cannot ask; nobody else can answer."""

from pathlib import Path

import msgspec
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.interrupts import interrupt
from runbus.messages import ModelRequest, RunApprovalRequested, RunCompleted, RunFailed
from runbus.messages.runs import ApprovalDecide
from runbus_examples import AGENTS_DIR
from runbus_examples.travel import tools as travel
from runbus_gateway.agents import load_agents
from runbus_tool_executor.registry import ToolRegistry
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack

asking = ToolRegistry()
asked: list[str] = []


@asking.tool()
def choose_seat(flight_id: str) -> str:
    """Pick a seat on a flight; asks the traveller which kind."""
    asked.append(flight_id)
    kind = interrupt(f"Window or aisle on {flight_id}?")
    return f"{kind} seat on {flight_id}"


@asking.tool(side_effect=True)
def pay(amount: int) -> str:
    """Pay; wrongly asks after it would have acted."""
    interrupt("Really?")
    return "paid"


@asking.tool()
def twice(flight_id: str) -> str:
    """Asks two questions."""
    seat = interrupt("Window or aisle?")
    meal = interrupt("Meal?")
    return f"{seat}, {meal}"


@asking.tool(approval="always")
def upgrade(flight_id: str) -> str:
    """Needs approval, then asks."""
    return f"upgraded to {interrupt('Which cabin?')}"


AGENTS = {
    "travel": msgspec.structs.replace(
        load_agents(AGENTS_DIR)["travel"],
        model="gated",
        tools=["choose_seat", "pay", "twice", "upgrade"],
    )
}


def seat_then_answer(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    results = [r for m in request.messages for r in m.function_results]
    if not results:
        return call("choose_seat", "c-seat", flight_id="QF1")
    return text(f"Done: {results[-1].error or results[-1].result}")


async def question(client: RunbusClient, run_id: str) -> RunApprovalRequested:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunApprovalRequested):
            return item.event
        assert not isinstance(item.event, RunCompleted | RunFailed), item.event
    raise AssertionError("no question")


async def final(client: RunbusClient, run_id: str) -> RunCompleted:
    async for item in client.follow(run_id, timeout=20):
        assert not isinstance(item.event, RunFailed), item.event
        if isinstance(item.event, RunCompleted):
            return item.event
    raise AssertionError("no final event")


async def test_a_tool_asks_its_owner_and_the_answer_resumes_the_call(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice, bob = users["alice"], users["bob"]
    asked.clear()
    model = GatedModel(seat_then_answer)
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": model},
        tool_registries=[travel, asking],
    ):
        run_id = await alice.start("travel", "A seat please", session_id="seat")
        asking_event = await question(alice, run_id)
        with pytest.raises(RemoteError) as forged:
            await bob.call(
                ops.API_APPROVALS_DECIDE,
                ApprovalDecide(run_id=run_id, call_id="c-seat", decision="approved", note="middle"),
            )
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id="c-seat", decision="approved", note="aisle"),
        )
        ended = await final(alice, run_id)

    assert asking_event.question
    assert asking_event.reason == "Window or aisle on QF1?"
    assert (asking_event.tool, asking_event.arguments) == ("choose_seat", {"flight_id": "QF1"})
    assert forged.value.remote_code == "not_found"
    assert ended.text == "Done: aisle seat on QF1"
    assert asked == ["QF1", "QF1"]  # asked, then called again with the answer
    assert len(model.requests) == 2  # the question did not go back to the model


async def test_a_declined_question_is_an_error_the_model_reads(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": GatedModel(seat_then_answer)},
        tool_registries=[travel, asking],
    ):
        run_id = await alice.start("travel", "A seat please", session_id="declined")
        await question(alice, run_id)
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id="c-seat", decision="denied"),
        )
        ended = await final(alice, run_id)

    assert "the user did not answer 'Window or aisle on QF1?' (denied)" in ended.text


@pytest.mark.parametrize("tool", ["twice", "upgrade"])
async def test_a_call_asks_at_most_once_and_never_after_an_approval(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient], tool: str
) -> None:
    alice = users["alice"]

    def ask_then_answer(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        results = [r for m in request.messages for r in m.function_results]
        if not results:
            return call(tool, "c-ask", flight_id="QF1")
        return text(f"Done: {results[-1].error or results[-1].result}")

    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": GatedModel(ask_then_answer)},
        tool_registries=[travel, asking],
    ):
        run_id = await alice.start("travel", "Go", session_id="twice")
        first = await question(alice, run_id)
        await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id="c-ask", decision="approved", note="aisle"),
        )
        ended = await final(alice, run_id)

    assert first.question == (tool == "twice")
    assert ended.text == (
        f"Done: tool {tool!r} asks at most one question per call, and none after an approval"
    )


async def test_a_tool_that_changes_things_cannot_ask(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]

    def pay_then_answer(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
        results = [r for m in request.messages for r in m.function_results]
        if not results:
            return call("pay", "c-pay", amount=10)
        return text(f"Done: {results[-1].error or results[-1].result}")

    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=AGENTS,
        routes={"gated": GatedModel(pay_then_answer)},
        tool_registries=[travel, asking],
    ):
        run_id = await alice.start("travel", "Pay", session_id="pay")
        ended = await final(alice, run_id)

    assert ended.text == "Done: tool 'pay' changes things and so cannot ask a question"
