"""Message groups and token estimates: the units compaction keeps or drops."""

import msgspec
import pytest

from runbus.messages import (
    ChatMessage,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    MessageGroup,
    ReasoningContent,
    Role,
    Source,
    TextContent,
    UriContent,
    UsageContent,
)
from runbus_compaction.core import MessageIndex, group_messages
from runbus_compaction.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_content_tokens,
    estimate_tokens,
)


def text(role: Role, value: str, source: Source = "external") -> ChatMessage:
    return ChatMessage(role=role, contents=[TextContent(text=value)], source=source)


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
        text("assistant", "[Summary]\nEarlier the user asked about Perth.", source="compaction"),
    ]

    assert shape(group_messages(prompt)) == [
        ("system", 0, 1),
        ("user", 1, 1),
        ("assistant_text", 2, 1),
        ("summary", 3, 1),
    ]


def test_a_system_message_stays_a_system_group_whatever_its_source() -> None:
    prompt = [text("user", "Hi"), text("system", "Earlier: Perth.", source="compaction")]

    assert shape(group_messages(prompt)) == [("user", 0, 1), ("system", 1, 1)]


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


def test_a_second_result_for_an_answered_call_is_dropped_not_joined_to_a_later_group() -> None:
    prompt = [calls("c1"), results("c1"), text("user", "and now?"), results("c1")]

    assert shape(group_messages(prompt)) == [("tool_call", 0, 2), ("user", 2, 1)]


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


def reasoning(value: str = "Let me think.") -> ChatMessage:
    return ChatMessage(role="assistant", contents=[ReasoningContent(text=value)])


def with_id(message: ChatMessage, message_id: str) -> ChatMessage:
    return msgspec.structs.replace(message, message_id=message_id)


def kinds_and_turns(groups: list[MessageGroup]) -> list[tuple[str, int | None]]:
    return [(g.kind, g.turn) for g in groups]


def test_turns_count_user_messages_and_system_messages_have_none() -> None:
    prompt = [
        text("system", "Be brief."),
        text("assistant", "Welcome back."),
        text("user", "Weather?"),
        calls("c1"),
        results("c1"),
        text("system", "The user is in a hurry."),
        text("assistant", "Sunny."),
        text("user", "Thanks"),
    ]

    assert kinds_and_turns(group_messages(prompt)) == [
        ("system", None),
        ("assistant_text", 0),
        ("user", 1),
        ("tool_call", 1),
        ("system", None),
        ("assistant_text", 1),
        ("user", 2),
    ]


def test_reasoning_only_messages_right_before_and_after_a_call_join_its_group() -> None:
    prompt = [text("user", "Weather?"), reasoning(), calls("c1"), results("c1"), reasoning()]

    assert shape(group_messages(prompt)) == [("user", 0, 1), ("tool_call", 1, 4)]


def test_reasoning_not_followed_by_a_call_is_assistant_text() -> None:
    prompt = [text("user", "Hi"), reasoning(), text("assistant", "Hello.")]

    assert shape(group_messages(prompt)) == [
        ("user", 0, 1),
        ("assistant_text", 1, 1),
        ("assistant_text", 2, 1),
    ]


def test_a_late_result_moves_next_to_its_call_ahead_of_what_came_between() -> None:
    call = with_id(calls("c1", "c2"), "a1")
    first, late = with_id(results("c1"), "t1"), with_id(results("c2"), "t2")
    note = with_id(text("system", "Context."), "s1")
    index = MessageIndex.build([text("user", "Both?"), call, first, note, late])

    assert [m.message_id for m in index.output()] == ["", "a1", "t1", "t2", "s1"]
    assert shape(index.wire_groups()) == [("user", 0, 1), ("tool_call", 1, 3), ("system", 4, 1)]
    assert index.repaired_ids == ["t2"]


def test_a_tool_message_answering_calls_of_two_groups_is_split_between_them() -> None:
    both = with_id(results("c1", "c2"), "t1")
    index = MessageIndex.build([calls("c1"), calls("c2"), both])

    groups = index.included()
    assert [len(g.messages) for g in groups] == [2, 2]
    assert [[r.call_id for r in g.messages[1].function_results] for g in groups] == [["c1"], ["c2"]]
    assert index.repaired_ids == ["t1"]


def test_a_result_whose_call_is_nowhere_is_dropped_and_reported() -> None:
    orphan = with_id(results("ghost"), "t9")
    index = MessageIndex.build([text("user", "Hi"), orphan, text("assistant", "Hello.")])

    assert [m.role for m in index.output()] == ["user", "assistant"]
    assert index.repaired_ids == ["t9"]


def test_a_tool_message_with_only_text_is_dropped_as_it_answers_no_call() -> None:
    stray = ChatMessage(role="tool", contents=[TextContent(text="42")], message_id="t1")
    index = MessageIndex.build([text("user", "Hi"), calls("c1"), results("c1"), stray])

    assert [m.message_id for m in index.output()].count("t1") == 0


def test_a_call_never_answered_is_taken_out_and_its_text_kept() -> None:
    asked = ChatMessage(
        role="assistant",
        contents=[
            TextContent(text="Checking both."),
            FunctionCallContent(call_id="c1", name="get_weather"),
            FunctionCallContent(call_id="c2", name="get_weather"),
        ],
        message_id="a1",
    )
    index = MessageIndex.build([text("user", "Both?"), asked, results("c1")])

    [_, group] = index.included()
    assert [c.call_id for c in group.messages[0].function_calls] == ["c1"]
    assert group.messages[0].text == "Checking both."
    assert index.repaired_ids == ["a1"]


def test_a_call_message_with_no_answered_call_becomes_text_or_goes() -> None:
    asked = ChatMessage(
        role="assistant",
        contents=[TextContent(text="One moment."), FunctionCallContent(call_id="c1", name="f")],
    )
    silent = calls("c2")

    index = MessageIndex.build([text("user", "Go"), asked, silent])

    assert shape(index.wire_groups()) == [("user", 0, 1), ("assistant_text", 1, 1)]
    assert index.output()[1].function_calls == []


def test_a_group_knows_its_bytes_tokens_and_message_count() -> None:
    [group] = group_messages([text("user", "é" * 10)])

    assert (group.bytes, group.tokens, group.count) == (20, MESSAGE_OVERHEAD_TOKENS + 5, 1)


def test_the_index_keeps_included_metrics_as_groups_are_excluded_and_replaced() -> None:
    index = MessageIndex.build(
        [text("system", "s"), text("user", "u"), calls("c1"), results("c1"), text("user", "v")]
    )
    assert (index.group_count, index.messages, index.turns, index.tool_call_groups) == (4, 5, 2, 1)

    index.exclude(2)
    assert (index.group_count, index.messages, index.turns, index.tool_call_groups) == (3, 3, 2, 0)
    index.exclude(1)
    assert index.turns == 1
    index.replace(1, index.new_group("summary", [text("assistant", "sum")], 1))

    assert index.tokens == sum(estimate_tokens(m) for m in index.output())
    assert (index.group_count, index.non_system_groups, index.turns) == (3, 2, 2)
