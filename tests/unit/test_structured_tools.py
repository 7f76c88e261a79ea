"""Tools offered through structured output to a model without native tool calls."""

from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    ModelRequest,
    TextContent,
    ToolSpec,
)
from runbus_model_router.structured_tools import offer, read_reply, response_format

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


def test_the_schema_admits_an_answer_or_a_call_of_an_offered_tool_only() -> None:
    schema = response_format([WEATHER])["json_schema"]["schema"]
    call, answer = schema["anyOf"]
    assert call["properties"]["tool"] == {"const": "get_weather"}
    assert call["properties"]["arguments"] == WEATHER.parameters
    assert answer["required"] == ["answer"]


def test_earlier_calls_and_results_become_text_and_the_tools_move_into_the_system_message() -> None:
    call = FunctionCallContent(call_id="c1", name="get_weather", arguments={"city": "Oslo"})
    request = ModelRequest(
        route="local",
        tools=[WEATHER],
        messages=[
            ChatMessage(role="system", contents=[TextContent(text="Be brief.")]),
            ChatMessage(role="user", contents=[TextContent(text="Weather in Oslo?")]),
            ChatMessage(role="assistant", contents=[call]),
            ChatMessage(
                role="tool", contents=[FunctionResultContent(call_id="c1", result={"temp": 3})]
            ),
        ],
    )
    offered = offer(request)
    assert offered.tools == []
    system, _, assistant, result = offered.messages
    assert system.text.startswith("Be brief.\n\nYou can use tools.")
    assert "get_weather: Current weather for a city" in system.text
    assert assistant.text == '{"tool": "get_weather", "arguments": {"city": "Oslo"}}'
    assert (result.role, result.text) == ("user", 'Tool result: {"temp": 3}')


def test_a_json_reply_becomes_a_function_call_or_the_answer_text() -> None:
    [call] = read_reply('{"tool": "get_weather", "arguments": {"city": "Rome"}}', [WEATHER])
    assert isinstance(call, FunctionCallContent)
    assert (call.name, call.arguments) == ("get_weather", {"city": "Rome"})
    assert read_reply('{"answer": "Hello"}', [WEATHER]) == [TextContent(text="Hello")]


def test_a_reply_that_is_not_the_json_asked_for_is_kept_as_text() -> None:
    for text in ('{"answer": "cut sho', '{"tool": "rm_rf", "arguments": {}}', "[1, 2]"):
        assert read_reply(text, [WEATHER]) == [TextContent(text=text)]
