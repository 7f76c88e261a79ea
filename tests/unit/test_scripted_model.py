"""The scripted test model: a fixed reply per step of the turn, no state between calls."""

from pathlib import Path

import msgspec
import pytest

from runbus.messages import (
    ChatMessage,
    FunctionResultContent,
    ModelRequest,
    ModelResponse,
    TextContent,
)
from runbus_examples.scripted import ScriptedCall, ScriptedModel, ScriptedReply, load_scripts
from runbus_model_router.errors import ScriptExhausted

REPLIES = [
    ScriptedReply(tool_calls=[ScriptedCall(name="get_weather", arguments={"city": "Sydney"})]),
    ScriptedReply(text="The tool said {last_result}."),
]


class Deltas:
    def __init__(self) -> None:
        self.pieces: list[str] = []

    async def __call__(self, piece: str) -> None:
        self.pieces.append(piece)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", contents=[TextContent(text=text)])


def assistant(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", contents=[TextContent(text=text)])


def tool(result: object) -> ChatMessage:
    return ChatMessage(role="tool", contents=[FunctionResultContent(call_id="c", result=result)])


async def complete(
    messages: list[ChatMessage],
    replies: list[ScriptedReply] = REPLIES,
    deltas: Deltas | None = None,
) -> ModelResponse:
    model = ScriptedModel("weather", replies)
    return await model.complete(
        ModelRequest(route="scripted/weather", messages=messages), deltas or Deltas()
    )


async def test_the_first_step_of_a_turn_gets_the_first_reply() -> None:
    reply = await complete([user("Weather?")])

    assert [(c.name, c.arguments) for c in reply.message.function_calls] == [
        ("get_weather", {"city": "Sydney"})
    ]
    assert reply.finish_reason == "tool_calls"
    assert reply.model == "scripted/weather"


async def test_the_reply_index_counts_assistant_messages_since_the_last_user_message() -> None:
    earlier_turn = [user("Hi"), assistant("a"), assistant("b"), assistant("c")]
    prompt = [*earlier_turn, user("Weather?"), assistant("calling"), tool({"t": 21})]

    reply = await complete(prompt)

    assert reply.message.text == 'The tool said {"t":21}.'
    assert reply.finish_reason == "stop"


async def test_last_result_is_the_latest_tool_result_of_the_turn() -> None:
    prompt = [user("Weather?"), tool({"t": 1}), assistant("calling"), tool(["newest"])]

    reply = await complete(prompt)

    assert reply.message.text == 'The tool said ["newest"].'


async def test_a_turn_longer_than_the_script_raises_script_exhausted() -> None:
    with pytest.raises(ScriptExhausted) as raised:
        await complete([user("Weather?"), assistant("1"), assistant("2")])

    assert raised.value.index == 2
    assert raised.value.code == "model_error"
    assert "'weather'" in raised.value.message


async def test_reply_text_is_streamed_in_pieces_that_join_to_the_text() -> None:
    deltas = Deltas()

    reply = await complete([user("Hi")], [ScriptedReply(text="Hello there, traveller.")], deltas)

    assert len(deltas.pieces) == 3
    assert "".join(deltas.pieces) == reply.message.text == "Hello there, traveller."


async def test_streamed_pieces_keep_leading_whitespace_of_the_reply() -> None:
    deltas = Deltas()

    reply = await complete([user("Hi")], [ScriptedReply(text="  - one\n  - two")], deltas)

    assert "".join(deltas.pieces) == reply.message.text


async def test_a_reply_may_carry_text_and_calls_together() -> None:
    both = [ScriptedReply(text="Checking.", tool_calls=[ScriptedCall(name="a"), ScriptedCall("b")])]

    reply = await complete([user("Hi")], both)

    assert reply.message.text == "Checking."
    assert [c.name for c in reply.message.function_calls] == ["a", "b"]
    assert len({c.call_id for c in reply.message.function_calls}) == 2


def test_scripts_load_from_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "scripts.toml"
    path.write_text(
        """
[[weather]]
tool_calls = [{name = "get_weather", arguments = {city = "Sydney"}}]

[[weather]]
text = "Done: {last_result}"

[[hello]]
text = "Hello!"
"""
    )

    scripts = load_scripts(path)

    assert scripts == {
        "weather": [
            ScriptedReply(
                tool_calls=[ScriptedCall(name="get_weather", arguments={"city": "Sydney"})]
            ),
            ScriptedReply(text="Done: {last_result}"),
        ],
        "hello": [ScriptedReply(text="Hello!")],
    }


def test_a_script_with_a_misspelled_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scripts.toml"
    path.write_text('[[hello]]\ntxt = "Hello!"\n')

    with pytest.raises(msgspec.ValidationError, match="txt"):
        load_scripts(path)
