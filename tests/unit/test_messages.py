"""Helpers on the wire types that services rely on: message text, calls, results, usage sums."""

import pytest

from runbus.messages import (
    ChatMessage,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    Usage,
    is_identifier,
)


def test_message_text_joins_only_its_text_parts_in_order() -> None:
    message = ChatMessage(
        role="assistant",
        contents=[
            TextContent(text="It's 21°C "),
            FunctionCallContent(call_id="c1", name="get_weather", arguments={"city": "Sydney"}),
            DataContent(data=b"\x89PNG", media_type="image/png"),
            TextContent(text="in Sydney."),
        ],
    )

    assert message.text == "It's 21°C in Sydney."


def test_message_lists_its_function_calls_and_results() -> None:
    call = FunctionCallContent(call_id="c1", name="get_weather")
    result = FunctionResultContent(call_id="c1", result={"ok": True})
    message = ChatMessage(role="tool", contents=[TextContent(text="x"), result, call])

    assert message.function_calls == [call]
    assert message.function_results == [result]


def test_a_new_chat_message_is_external_with_no_id_yet() -> None:
    message = ChatMessage(role="user", contents=[])

    assert (message.source, message.message_id, message.created_at) == ("external", "", None)


def test_usage_adds_input_and_output_tokens_separately() -> None:
    total = Usage(input_tokens=10, output_tokens=2) + Usage(input_tokens=5, output_tokens=7)

    assert total == Usage(input_tokens=15, output_tokens=9)


@pytest.mark.parametrize("value", ["s1", "r-7f3a", "A_b-9", "x" * 128])
def test_subject_safe_ids_are_identifiers(value: str) -> None:
    assert is_identifier(value)


@pytest.mark.parametrize("value", ["", "a.b", "s>", "*", "a b", "x" * 129, "s1\n"])
def test_ids_that_would_change_a_subject_are_not_identifiers(value: str) -> None:
    assert not is_identifier(value)
