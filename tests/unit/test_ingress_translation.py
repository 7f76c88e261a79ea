"""The ingress's pure translations: an OpenAI conversation into a run's input, and run events
into AG-UI events."""

import pytest
from ag_ui import core as ag

from runbus.errors import BadRequest
from runbus.messages import (
    ErrorInfo,
    FunctionCallContent,
    FunctionResultContent,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolResult,
)
from runbus_ingress.agui import Translator
from runbus_ingress.openai_chat import run_input
from runbus_ingress.openai_wire import ChatInMessage


def m(role: str, content: str) -> ChatInMessage:
    return ChatInMessage(role=role, content=content)  # type: ignore[arg-type]


CONVERSATION = [
    m("system", "Be brief."),
    m("user", "Weather in Sydney?"),
    m("assistant", "Sunny."),
    m("user", "And Perth?"),
]


def test_a_resumed_session_gets_only_the_last_user_turn() -> None:
    (message,) = run_input(CONVERSATION, resumed=True)

    assert (message.role, message.text) == ("user", "And Perth?")


def test_a_new_session_gets_the_earlier_turns_as_quoted_user_context_never_as_system() -> None:
    (message,) = run_input(CONVERSATION, resumed=False)

    assert message.role == "user"
    assert message.contents[0].text.splitlines()[1:4] == [  # type: ignore[union-attr]
        "system: Be brief.",
        "user: Weather in Sydney?",
        "assistant: Sunny.",
    ]
    assert message.contents[-1].text == "And Perth?"  # type: ignore[union-attr]


def test_a_conversation_that_does_not_end_with_user_text_is_refused() -> None:
    with pytest.raises(BadRequest):
        run_input([m("user", "Hi"), m("assistant", "Hello")], resumed=True)


def test_run_events_become_agui_events_with_text_messages_closed_before_tools() -> None:
    translator = Translator("t", "r")
    call = FunctionCallContent(call_id="c1", name="get_weather", arguments={"city": "Perth"})
    events: list[RunEvent] = [
        RunStarted(run_id="r", session_id="s", agent="travel"),
        RunTextDelta(run_id="r", message_id="m0", delta="Let me "),
        RunTextDelta(run_id="r", message_id="m0", delta="check."),
        RunToolCall(run_id="r", call=call),
        RunToolResult(run_id="r", result=FunctionResultContent(call_id="c1", result={"t": 20})),
        RunCompleted(run_id="r", response=[], text="Let me check."),
    ]
    out = [e for event in events for e in translator.translate(event)]
    failed = Translator("t", "r").translate(
        RunFailed(run_id="r", error=ErrorInfo(code="cancelled", message="stop"))
    )

    assert [e.type for e in out] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "RUN_FINISHED",
    ]
    assert out[0].thread_id == "s"  # type: ignore[attr-defined]
    assert isinstance(failed[0], ag.RunErrorEvent)
    assert failed[0].code == "cancelled"
