"""Message groups and token estimates: the units compaction keeps or drops."""

import pytest

from runbus.messages import (
    ChatMessage,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    MessageGroup,
    TextContent,
    UriContent,
    UsageContent,
)
from runbus_compaction.core import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_content_tokens,
    estimate_tokens,
    group_messages,
)


def text(role: str, value: str, **kw: str) -> ChatMessage:
    return ChatMessage(role=role, contents=[TextContent(text=value)], **kw)  # type: ignore[arg-type]


def calls(*call_ids: str) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        contents=[
            FunctionCallContent(call_id=c, name="get_weather", arguments={"city": "Sydney"})
            for c in call_ids
        ],
    )


def results(*call_ids: str) -> ChatMessage:
    return ChatMessage(
        role="tool",
        contents=[FunctionResultContent(call_id=c, result={"temperature_c": 21}) for c in call_ids],
    )


def shape(groups: list[MessageGroup]) -> list[tuple[str, int, int]]:
    return [(g.kind, g.start, g.count) for g in groups]


def test_each_plain_message_is_its_own_group_of_its_kind() -> None:
    prompt = [
        text("system", "You are a travel assistant."),
        text("user", "Weather in Sydney?"),
        text("assistant", "It's sunny."),
        text("system", "Earlier the user asked about Perth.", source="compaction"),
    ]

    assert shape(group_messages(prompt)) == [
        ("system", 0, 1),
        ("user", 1, 1),
        ("assistant_text", 2, 1),
        ("summary", 3, 1),
    ]


def test_a_tool_call_group_holds_the_call_and_the_message_answering_it() -> None:
    prompt = [text("user", "Weather?"), calls("c1"), results("c1"), text("assistant", "Sunny.")]

    assert shape(group_messages(prompt)) == [
        ("user", 0, 1),
        ("tool_call", 1, 2),
        ("assistant_text", 3, 1),
    ]


def test_parallel_calls_answered_one_message_each_stay_in_one_group() -> None:
    prompt = [calls("c1", "c2", "c3"), results("c2"), results("c1"), results("c3")]

    assert shape(group_messages(prompt)) == [("tool_call", 0, 4)]


def test_parallel_calls_answered_in_one_message_stay_in_one_group() -> None:
    prompt = [text("user", "Weather in Sydney and Tokyo?"), calls("c1", "c2"), results("c1", "c2")]

    assert shape(group_messages(prompt)) == [("user", 0, 1), ("tool_call", 1, 2)]


def test_consecutive_tool_rounds_are_separate_groups() -> None:
    prompt = [calls("c1"), results("c1"), calls("c2"), results("c2")]

    assert shape(group_messages(prompt)) == [("tool_call", 0, 2), ("tool_call", 2, 2)]


def test_a_result_for_a_call_of_an_earlier_group_does_not_join_a_later_group() -> None:
    prompt = [calls("c1"), results("c1"), text("user", "and now?"), results("c1")]

    groups = group_messages(prompt)

    assert shape(groups)[:2] == [("tool_call", 0, 2), ("user", 2, 1)]
    assert len(groups) == 3
    assert groups[2].start == 3


def test_text_is_estimated_at_four_bytes_a_token_rounded_up() -> None:
    assert estimate_content_tokens(TextContent(text="abcdefgh")) == 2
    assert estimate_content_tokens(TextContent(text="abcdefghi")) == 3
    assert estimate_content_tokens(TextContent(text="é")) == 1
    assert estimate_content_tokens(TextContent(text="ééé")) == 2


def test_other_parts_are_estimated_by_their_size() -> None:
    assert estimate_content_tokens(DataContent(data=b"x" * 400, media_type="image/png")) == 100
    assert estimate_content_tokens(UriContent(uri="https://example.com/a")) == 6
    assert estimate_content_tokens(UsageContent(input_tokens=99, output_tokens=99)) == 0
    assert estimate_content_tokens(FunctionCallContent(call_id="c", name="f")) > 0
    assert estimate_content_tokens(FunctionResultContent(call_id="c", error="x" * 40)) >= 10


def test_a_message_costs_its_parts_plus_a_fixed_overhead() -> None:
    message = ChatMessage(
        role="user", contents=[TextContent(text="a" * 8), TextContent(text="b" * 4)]
    )

    assert estimate_tokens(message) == MESSAGE_OVERHEAD_TOKENS + 2 + 1
    assert estimate_tokens(ChatMessage(role="user", contents=[])) == MESSAGE_OVERHEAD_TOKENS


@pytest.mark.parametrize("size", [0, 1, 100, 5000])
def test_group_tokens_add_up_to_the_estimate_of_every_message(size: int) -> None:
    prompt = [
        text("system", "s" * size),
        text("user", "u" * size),
        calls("c1", "c2"),
        results("c1"),
        results("c2"),
        text("assistant", "a" * size),
    ]

    groups = group_messages(prompt)

    assert sum(g.tokens for g in groups) == sum(estimate_tokens(m) for m in prompt)
    assert sum(g.count for g in groups) == len(prompt)
    assert groups[2].tokens == sum(estimate_tokens(m) for m in prompt[2:5])


def test_an_empty_prompt_has_no_groups() -> None:
    assert group_messages([]) == []
