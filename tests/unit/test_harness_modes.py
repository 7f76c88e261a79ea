"""Agent modes: plan (default) and execute, switched by the model or by a host, who leaves a
note the model hears once."""

from typing import Any

import msgspec
import pytest

from runbus import modes as stored
from runbus.messages import FunctionCallContent
from runbus.modes import ModeState, host_set
from runbus_gateway.harness import modes


def call(name: str, **arguments: Any) -> FunctionCallContent:
    return FunctionCallContent(call_id="c1", name=name, arguments=arguments)


def test_a_session_without_a_stored_mode_is_in_the_agents_default_mode() -> None:
    assert stored.load(None).mode == "plan"
    assert stored.load(None, "execute").mode == "execute"


def test_mode_get_reads_the_mode_and_mode_set_switches_it() -> None:
    state = ModeState(mode="plan")

    same, got = modes.apply(state, call("mode_get"))
    switched, result = modes.apply(state, call("mode_set", mode="execute"))

    assert same is state
    assert got.result == "plan"
    assert switched == ModeState(mode="execute")
    assert result.result == "mode is now 'execute'"


def test_setting_the_mode_the_agent_is_in_changes_nothing() -> None:
    state = ModeState(mode="plan")

    after, result = modes.apply(state, call("mode_set", mode="plan"))

    assert after is state
    assert result.error is None


@pytest.mark.parametrize(
    ("name", "arguments", "complaint"),
    [
        ("mode_set", {"mode": "yolo"}, "Invalid enum value 'yolo'"),
        ("mode_set", {}, "missing required field `mode`"),
        ("mode_get", {"mode": "plan"}, "unknown field `mode`"),
        ("mode_toggle", {}, "no mode tool named 'mode_toggle'"),
    ],
)
def test_bad_mode_calls_are_error_results(
    name: str, arguments: dict[str, Any], complaint: str
) -> None:
    state = ModeState(mode="plan")

    after, result = modes.apply(state, call(name, **arguments))

    assert after is state
    assert result.error is not None
    assert complaint in result.error


def test_a_host_switch_is_announced_once_then_acknowledged() -> None:
    state = host_set(ModeState(mode="plan"), "execute")

    notice = modes.notification(state)

    assert state == ModeState(mode="execute", changed_from="plan")
    assert notice is not None
    assert notice.role == "user"
    assert notice.source == "context_provider"
    assert notice.text == (
        "[Mode changed: the user switched the mode from 'plan' to 'execute'. "
        "Work the 'execute' way from now on.]"
    )
    assert modes.notification(modes.acknowledged(state)) is None


def test_a_host_switching_back_before_the_model_heard_leaves_nothing_to_announce() -> None:
    there = host_set(ModeState(mode="plan"), "execute")

    back = host_set(there, "plan")

    assert back == ModeState(mode="plan")
    assert modes.notification(back) is None


def test_a_model_switch_clears_a_pending_host_note() -> None:
    state = host_set(ModeState(mode="plan"), "execute")

    after, _ = modes.apply(state, call("mode_set", mode="execute"))

    assert after == ModeState(mode="execute")


def test_the_instructions_describe_both_modes_and_name_the_current_one() -> None:
    text = modes.instructions(ModeState(mode="execute"))

    assert "### plan" in text
    assert "### execute" in text
    assert text.rstrip().endswith("You are in execute mode now.")
    assert modes.instructions(ModeState(mode="plan"), "Mode: {mode}") == "Mode: plan"


def test_the_stored_mode_round_trips_and_a_bad_value_is_refused() -> None:
    state = ModeState(mode="execute", changed_from="plan")

    assert stored.load(msgspec.json.decode(msgspec.json.encode(stored.dump(state)))) == state
    with pytest.raises(msgspec.ValidationError):
        stored.load({"mode": "yolo"})
