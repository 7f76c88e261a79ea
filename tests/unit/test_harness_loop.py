"""Loop mode: the agent goes on while todo items are open, stops at the bound, and stops for a
pending approval."""

from typing import Any

import msgspec
import pytest

from runbus import modes, todos
from runbus.todos import TodoItem, TodoState
from runbus_gateway.errors import GatewayConfigError
from runbus_gateway.harness import Harness, HarnessConfig
from runbus_gateway.harness.errors import StateInvalid
from runbus_gateway.harness.evaluators import (
    Continue,
    LoopContext,
    Stop,
    TodosOpen,
    build_evaluators,
    decide,
    feedback_message,
)


def bag(*items: TodoItem, mode: modes.Mode | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {
        todos.STATE_KEY: todos.dump(TodoState(items=list(items), next_id=len(items) + 1))
    }
    if mode is not None:
        value[modes.STATE_KEY] = modes.dump(modes.ModeState(mode=mode))
    return value


OPEN = (
    TodoItem(id=1, title="Compare flights", done=True),
    TodoItem(id=2, title="Book hotel", description="near the venue"),
    TodoItem(id=3, title="Check the weather"),
)


def context(state: dict[str, Any], iteration: int = 1) -> LoopContext:
    return LoopContext(iteration=iteration, state=state, answer="Done with flights.")


def test_open_todos_continue_the_loop_with_feedback_listing_them() -> None:
    decision = decide([TodosOpen()], context(bag(*OPEN)))

    assert isinstance(decision, Continue)
    assert decision.evaluator == "todos_open"
    assert decision.feedback.endswith(
        "\n- 2 [open] Book hotel: near the venue\n- 3 [open] Check the weather"
    )
    assert "Compare flights" not in decision.feedback


def test_the_loop_stops_when_every_item_is_done_or_there_is_no_list() -> None:
    done = TodoItem(id=1, title="a", done=True)

    assert decide([TodosOpen()], context(bag(done))) == Stop(reason="done")
    assert decide([TodosOpen()], context({})) == Stop(reason="done")


def test_the_loop_stops_at_its_bound_whatever_the_evaluators_say() -> None:
    assert isinstance(decide([TodosOpen()], context(bag(*OPEN), 9)), Continue)
    assert decide([TodosOpen()], context(bag(*OPEN), 10)) == Stop(reason="iteration_cap")
    assert decide([TodosOpen()], context(bag(*OPEN), 3), max_loop_iterations=3) == Stop(
        reason="iteration_cap"
    )


def test_an_evaluator_for_execute_mode_waits_while_the_agent_plans() -> None:
    only_execute = TodosOpen(only_in_execute=True)

    assert decide([only_execute], context(bag(*OPEN, mode="plan"))) == Stop(reason="done")
    assert decide([only_execute], context(bag(*OPEN))) == Stop(reason="done")
    assert isinstance(decide([only_execute], context(bag(*OPEN, mode="execute"))), Continue)


def test_the_feedback_is_a_stored_user_turn() -> None:
    message = feedback_message(Continue(feedback="Go on.", evaluator="todos_open"), "r-1:loop1")

    assert (message.role, message.source, message.message_id) == ("user", "external", "r-1:loop1")
    assert message.text == "Go on."


def test_an_unreadable_todo_list_is_a_typed_error() -> None:
    with pytest.raises(StateInvalid, match="state 'todos'"):
        decide([TodosOpen()], context({"todos": {"items": 3}}))


def test_an_unknown_evaluator_is_a_config_error_naming_it() -> None:
    with pytest.raises(GatewayConfigError, match="unknown loop evaluator 'judge'"):
        build_evaluators([{"name": "judge"}])


def harness(table: dict[str, Any]) -> Harness:
    return Harness.from_config(msgspec.convert(table, HarnessConfig))


def test_the_harness_loops_only_when_loop_mode_is_on() -> None:
    off = harness({"todos": {"enabled": True}})
    on = harness({"todos": {"enabled": True}, "loop": {"enabled": True, "max_loop_iterations": 2}})

    assert off.next_pass(bag(*OPEN), iteration=1, answer="") == Stop(reason="done")
    assert isinstance(on.next_pass(bag(*OPEN), iteration=1, answer=""), Continue)
    assert on.next_pass(bag(*OPEN), iteration=2, answer="") == Stop(reason="iteration_cap")


def test_the_harness_reads_the_mode_with_the_agents_default() -> None:
    execute_first = harness(
        {
            "todos": {"enabled": True},
            "modes": {"enabled": True, "default": "execute"},
            "loop": {
                "enabled": True,
                "evaluators": [{"name": "todos_open", "only_in_execute": True}],
            },
        }
    )

    assert isinstance(execute_first.next_pass(bag(*OPEN), iteration=1, answer=""), Continue)
    assert execute_first.next_pass(bag(*OPEN, mode="plan"), iteration=1, answer="") == Stop(
        reason="done"
    )
