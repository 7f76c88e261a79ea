"""Triggers, targets, the floor and every strategy on hand-built histories, without a bus."""

import tomllib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import msgspec
import pytest

from runbus.errors import BadRequest, ModelError
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    Role,
    TextContent,
    Usage,
)
from runbus.messages.compaction import (
    AllOf,
    Always,
    AnyOf,
    CompactionStrategy,
    ContextWindowCompaction,
    GroupsExceed,
    HasToolCalls,
    MessagesExceed,
    Never,
    NoCompaction,
    PipelineCompaction,
    SlidingWindowCompaction,
    SummarizationCompaction,
    TokensBelow,
    TokensExceed,
    ToolResultCompaction,
    Trigger,
    TruncationCompaction,
    TurnsExceed,
    strategy_from_config,
)
from runbus_compaction.core import MessageIndex
from runbus_compaction.errors import EmptyPrompt, InvalidStrategy
from runbus_compaction.strategies import (
    SUMMARY_REQUEST,
    Compaction,
    Summarize,
    SummaryCall,
    SummaryReply,
    compact,
)
from runbus_compaction.tokens import estimate_tokens
from runbus_compaction.triggers import holds

WHEN = datetime(2026, 3, 3, 10, 0, tzinfo=UTC)


def say(role: Role, text: str, message_id: str) -> ChatMessage:
    return ChatMessage(
        role=role, contents=[TextContent(text=text)], message_id=message_id, created_at=WHEN
    )


def ask(message_id: str, *calls: tuple[str, str]) -> ChatMessage:
    """An assistant message calling (call_id, tool name) pairs."""
    return ChatMessage(
        role="assistant",
        contents=[FunctionCallContent(call_id=c, name=n, arguments={"q": c}) for c, n in calls],
        message_id=message_id,
        created_at=WHEN,
    )


def answer(message_id: str, *results: tuple[str, object]) -> ChatMessage:
    return ChatMessage(
        role="tool",
        contents=[FunctionResultContent(call_id=c, result=r) for c, r in results],
        message_id=message_id,
    )


def session(turns: int, *, result: object = "Sunny, 22°C") -> list[ChatMessage]:
    """Instructions, then per turn: a question, a weather call with its result, an answer."""
    prompt = [say("system", "You are a travel assistant.", "sys")]
    for i in range(turns):
        prompt += [
            say("user", f"Weather in city {i}?", f"u{i}"),
            ask(f"a{i}", (f"c{i}", "get_weather")),
            answer(f"t{i}", (f"c{i}", result)),
            say("assistant", f"It is sunny in city {i}.", f"r{i}"),
        ]
    return prompt


def ids(result: Compaction) -> list[str]:
    return [m.message_id for m in result.messages]


def tokens(messages: list[ChatMessage]) -> int:
    return sum(estimate_tokens(m) for m in messages)


def replying(text: str, calls: list[SummaryCall] | None = None) -> Summarize:
    async def summarize(call: SummaryCall) -> SummaryReply:
        if calls is not None:
            calls.append(call)
        return SummaryReply(text=text, usage=Usage(input_tokens=50, output_tokens=7))

    return summarize


def failing(error: Exception) -> Callable[[SummaryCall], Awaitable[SummaryReply]]:
    async def summarize(call: SummaryCall) -> SummaryReply:
        raise error

    return summarize


# Triggers -------------------------------------------------------------------------------------

# session(2): system + 8 messages in 7 groups (user, tool_call, assistant_text per turn, + system)
INDEX_FACTS = {"tokens": tokens(session(2)), "messages": 9, "groups": 7, "turns": 2}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (Always(), True),
        (Never(), False),
        (TokensExceed(tokens=INDEX_FACTS["tokens"] - 1), True),
        (TokensExceed(tokens=INDEX_FACTS["tokens"]), False),
        (TokensBelow(tokens=INDEX_FACTS["tokens"] + 1), True),
        (TokensBelow(tokens=INDEX_FACTS["tokens"]), False),
        (MessagesExceed(messages=8), True),
        (MessagesExceed(messages=9), False),
        (TurnsExceed(turns=1), True),
        (TurnsExceed(turns=2), False),
        (GroupsExceed(groups=6), True),
        (GroupsExceed(groups=7), False),
        (HasToolCalls(), True),
        (AllOf(of=[HasToolCalls(), TurnsExceed(turns=1)]), True),
        (AllOf(of=[HasToolCalls(), TurnsExceed(turns=2)]), False),
        (AnyOf(of=[Never(), TurnsExceed(turns=2)]), False),
        (AnyOf(of=[Never(), GroupsExceed(groups=0)]), True),
    ],
    ids=repr,
)
def test_each_trigger_reads_the_included_groups_metrics(condition: Trigger, expected: bool) -> None:
    assert holds(condition, MessageIndex.build(session(2))) is expected


def test_turns_before_the_first_user_message_are_not_counted_as_a_turn() -> None:
    index = MessageIndex.build([say("assistant", "Welcome!", "w"), say("user", "Hi", "u")])

    assert holds(TurnsExceed(turns=0), index)
    assert not holds(TurnsExceed(turns=1), index)


def test_has_tool_calls_stops_holding_once_every_tool_group_is_collapsed() -> None:
    index = MessageIndex.build(session(1))
    index.exclude(2)

    assert not holds(HasToolCalls(), index)


# tool_result ----------------------------------------------------------------------------------


async def test_tool_result_collapses_an_old_tool_group_in_place_into_one_assistant_message() -> (
    None
):
    result = await compact(
        session(3), ToolResultCompaction(trigger=HasToolCalls(), minimum_preserved=2)
    )

    assert ids(result)[:5] == ["sys", "u0", ids(result)[2], "r0", "u1"]
    collapsed = result.messages[2]
    assert collapsed.role == "assistant"
    assert collapsed.source == "compaction"
    assert collapsed.created_at == WHEN
    assert collapsed.text == "[Tool Calls]\nget_weather:\n  - Sunny, 22°C"
    assert [g.kind for g in result.groups][:4] == ["system", "user", "summary", "assistant_text"]
    # The newest two groups (the last tool call and its answer) are the floor.
    assert ids(result)[-3:] == ["a2", "t2", "r2"]


async def test_tool_result_groups_parallel_calls_by_name_in_first_seen_order() -> None:
    prompt = [
        say("user", "Weather in Sydney and Perth, and flights?", "u0"),
        ask("a0", ("c1", "get_weather"), ("c2", "search_flights"), ("c3", "get_weather")),
        answer("t1", ("c3", "Rain, 14°C")),
        answer("t2", ("c1", "Sunny, 22°C"), ("c2", {"flight_id": "QF1"})),
        say("assistant", "Done.", "r0"),
        say("user", "Thanks", "u1"),
    ]

    result = await compact(prompt, ToolResultCompaction(trigger=Always(), minimum_preserved=1))

    assert result.messages[1].text == (
        "[Tool Calls]\n"
        "get_weather:\n"
        "  - Sunny, 22°C\n"
        "  - Rain, 14°C\n"
        "search_flights:\n"
        '  - {"flight_id":"QF1"}'
    )
    assert ids(result) == ["u0", result.messages[1].message_id, "r0", "u1"]


async def test_tool_result_cuts_long_results_and_keeps_errors_readable() -> None:
    prompt = [
        say("user", "Go", "u0"),
        ask("a0", ("c1", "fetch"), ("c2", "fetch")),
        ChatMessage(
            role="tool",
            contents=[
                FunctionResultContent(call_id="c1", result="x" * 50),
                FunctionResultContent(call_id="c2", error="timeout\nafter 5 s"),
            ],
        ),
        say("user", "Again", "u1"),
    ]
    spec = ToolResultCompaction(trigger=Always(), minimum_preserved=1, max_result_chars=20)

    result = await compact(prompt, spec)

    assert result.messages[1].text == (
        "[Tool Calls]\nfetch:\n  - xxxxxxxxxxxxxxxxxxxx…\n  - timeout\n    after 5 s"
    )


async def test_tool_result_stops_as_soon_as_its_target_holds() -> None:
    prompt = session(4, result="x" * 2000)
    whole = tokens(prompt)

    result = await compact(
        prompt,
        ToolResultCompaction(
            trigger=HasToolCalls(), target=TokensBelow(tokens=whole - 50), minimum_preserved=0
        ),
    )

    assert [g.kind for g in result.groups].count("summary") == 1
    assert result.report.steps[0].target_reached


async def test_tool_result_never_crosses_its_floor_even_if_the_target_is_not_reached() -> None:
    result = await compact(
        session(3), ToolResultCompaction(trigger=HasToolCalls(), minimum_preserved=5)
    )

    # Newest five non-system groups: u1's turn (3 groups) is partly inside, so only turn 0's
    # tool group may go.
    assert ids(result).count("a0") == 0
    assert "a1" in ids(result)
    assert "a2" in ids(result)
    step = result.report.steps[0]
    assert step.compacted
    assert not step.target_reached


# truncation -----------------------------------------------------------------------------------


async def test_truncation_drops_the_oldest_groups_until_the_target_holds() -> None:
    prompt = session(4)
    budget = tokens(prompt[:1]) + tokens(prompt[-4:])

    result = await compact(prompt, TruncationCompaction(trigger=TokensExceed(tokens=budget)))

    assert ids(result) == ["sys", "u3", "a3", "t3", "r3"]
    assert result.report.tokens_after <= budget
    assert result.report.steps[0].target_reached


async def test_truncation_keeps_system_messages_in_the_middle_and_turn_zero() -> None:
    prompt = [
        say("system", "Instructions.", "sys"),
        say("assistant", "Welcome back, Alice.", "hello"),
        *session(3)[1:5],
        say("system", "Mid-conversation note.", "note"),
        *session(3)[5:],
    ]

    result = await compact(
        prompt, TruncationCompaction(trigger=Always(), target=Never(), minimum_preserved=1)
    )

    assert ids(result) == ["sys", "hello", "note", "r2"]


async def test_truncation_with_no_room_above_the_floor_changes_nothing() -> None:
    result = await compact(session(1), TruncationCompaction(trigger=Always(), minimum_preserved=3))

    assert ids(result) == ids(await compact(session(1)))
    assert result.report.steps[0].triggered
    assert not result.compacted


# sliding_window -------------------------------------------------------------------------------


async def test_sliding_window_keeps_the_last_turns_whole() -> None:
    result = await compact(session(5), SlidingWindowCompaction(trigger=TurnsExceed(turns=2)))

    assert ids(result) == ["sys", "u3", "a3", "t3", "r3", "u4", "a4", "t4", "r4"]
    assert {g.turn for g in result.groups} == {None, 4, 5}


async def test_sliding_window_floor_counts_turns_not_groups() -> None:
    result = await compact(
        session(5),
        SlidingWindowCompaction(trigger=TurnsExceed(turns=1), minimum_preserved=3),
    )

    assert ids(result)[1:] == [f"{k}{i}" for i in (2, 3, 4) for k in "uatr"]
    assert not result.report.steps[0].target_reached


# summarization --------------------------------------------------------------------------------


async def test_summarization_replaces_the_oldest_groups_where_the_first_of_them_was() -> None:
    calls: list[SummaryCall] = []
    prompt = [*session(3)[:5], say("system", "Note.", "note"), *session(3)[5:]]
    spec = SummarizationCompaction(
        trigger=Always(), target=TurnsExceed(turns=99), minimum_preserved=4, route="cheap-one"
    )

    result = await compact(prompt, spec, summarize=replying("Asked about cities 0 and 1.", calls))

    summary = result.messages[1]
    assert summary.text == "[Summary]\nAsked about cities 0 and 1."
    assert (summary.role, summary.source, summary.created_at) == ("assistant", "compaction", WHEN)
    assert ids(result) == ["sys", summary.message_id, "note", "r1", "u2", "a2", "t2", "r2"]
    assert result.report.added_message_ids == [summary.message_id]
    assert result.report.excluded_message_ids == ["u0", "a0", "t0", "r0", "u1", "a1", "t1"]
    assert result.report.usage == Usage(input_tokens=50, output_tokens=7)
    [call] = calls
    assert call.route == "cheap-one"
    transcript = call.messages[-1].text
    assert transcript.startswith("user: Weather in city 0?\nassistant called get_weather(")
    assert "tool get_weather returned: Sunny, 22°C" in transcript
    assert "Note." not in transcript
    assert transcript.endswith(SUMMARY_REQUEST)


async def test_summarization_stops_marking_groups_once_the_target_holds() -> None:
    calls: list[SummaryCall] = []
    prompt = session(3)
    spec = SummarizationCompaction(trigger=Always(), target=GroupsExceed(groups=0))

    result = await compact(prompt, spec, summarize=replying("Hi.", calls))

    # Any target that holds after one group stops the marking there: one group summarised.
    assert calls[0].messages[-1].text.startswith("user: Weather in city 0?\n\n")
    assert ids(result)[2:4] == ["a0", "t0"]


async def test_a_blank_summary_becomes_summary_unavailable() -> None:
    spec = SummarizationCompaction(trigger=Always(), minimum_preserved=1)

    result = await compact(session(2), spec, summarize=replying("  \n"))

    assert result.messages[1].text == "[Summary]\n[Summary unavailable]"
    assert result.compacted


@pytest.mark.parametrize(
    ("error", "code"),
    [(ModelError("the provider returned 500"), "model_error"), (ValueError("bug"), "internal")],
    ids=["model_error", "unexpected"],
)
async def test_a_failed_summary_call_leaves_the_prompt_as_it_was_and_says_why(
    error: Exception, code: str
) -> None:
    prompt = session(3)
    spec = SummarizationCompaction(trigger=Always(), minimum_preserved=1)

    result = await compact(prompt, spec, summarize=failing(error))

    assert result.messages == prompt
    assert not result.compacted
    [step] = result.report.steps
    assert step.triggered
    assert step.error is not None
    assert step.error.code == code
    assert step.tokens_after == step.tokens_before
    assert result.report.excluded_message_ids == []


async def test_a_pipeline_goes_on_after_a_failed_summary_so_the_fuse_still_holds() -> None:
    spec = PipelineCompaction(
        steps=[
            SummarizationCompaction(trigger=Always(), minimum_preserved=1),
            TruncationCompaction(trigger=GroupsExceed(groups=3), minimum_preserved=1),
        ]
    )

    result = await compact(session(3), spec, summarize=failing(ModelError("down")))

    assert ids(result) == ["sys", "a2", "t2", "r2"]
    assert [s.strategy for s in result.report.steps] == ["summarization", "truncation"]
    assert result.report.steps[0].error is not None
    assert result.report.steps[1].compacted


# pipeline and context_window ------------------------------------------------------------------


async def test_a_pipeline_runs_its_steps_in_order_each_on_what_the_previous_left() -> None:
    prompt = session(6, result="x" * 400)
    after_tools = tokens(prompt) - 5 * 95
    spec = PipelineCompaction(
        steps=[
            ToolResultCompaction(trigger=TokensExceed(tokens=after_tools), minimum_preserved=2),
            SlidingWindowCompaction(trigger=TurnsExceed(turns=8)),
            TruncationCompaction(trigger=TokensExceed(tokens=10_000)),
        ]
    )

    result = await compact(prompt, spec)

    steps = result.report.steps
    assert [(s.path, s.strategy) for s in steps] == [
        ("$.steps[0]", "tool_result"),
        ("$.steps[1]", "sliding_window"),
        ("$.steps[2]", "truncation"),
    ]
    assert [s.triggered for s in steps] == [True, False, False]
    assert steps[1].tokens_before == steps[0].tokens_after
    assert result.report.strategy == "pipeline"


async def test_context_window_collapses_tools_over_half_the_budget_and_truncates_over_80() -> None:
    prompt = session(6, result="x" * 400)
    input_budget = int(tokens(prompt) * 1.2)
    spec = ContextWindowCompaction(max_context=input_budget + 100, max_output=100)

    result = await compact(prompt, spec)

    tool_phase, truncation_phase = result.report.steps
    assert (tool_phase.path, truncation_phase.path) == ("$.tool_result", "$.truncation")
    assert tool_phase.triggered
    assert tool_phase.compacted
    assert truncation_phase.triggered
    assert int(input_budget * 0.5) < result.report.tokens_after <= int(input_budget * 0.8)
    assert ids(result)[-4:] == ["u5", "a5", "t5", "r5"]


async def test_nothing_is_compacted_with_at_most_one_non_system_group() -> None:
    prompt = [say("system", "s", "sys"), say("user", "x" * 4000, "u0")]
    spec = TruncationCompaction(trigger=Always(), minimum_preserved=0)

    result = await compact(prompt, spec)

    assert result.messages == prompt
    assert not result.report.steps[0].triggered


async def test_the_default_strategy_leaves_the_prompt_whole() -> None:
    prompt = session(3)

    result = await compact(prompt)

    assert result.messages == prompt
    assert not result.compacted
    assert result.report.strategy == "none"
    assert result.report.steps == []
    assert result.total_tokens == tokens(prompt) == sum(g.tokens for g in result.groups)


async def test_legacy_max_tokens_collapses_tool_results_then_truncates_to_the_budget() -> None:
    prompt = session(10, result="x" * 400)

    result = await compact(prompt, NoCompaction(), max_tokens=600)

    assert result.report.strategy == "max_tokens"
    assert [s.strategy for s in result.report.steps] == ["tool_result", "truncation"]
    assert result.total_tokens <= 600
    assert ids(result)[:2] == ["sys", "r5"]
    assert ids(result)[-4:] == ["u9", "a9", "t9", "r9"]


# report -----------------------------------------------------------------------------------------


async def test_the_report_counts_groups_messages_and_tokens_before_and_after() -> None:
    prompt = session(4)

    result = await compact(prompt, SlidingWindowCompaction(trigger=TurnsExceed(turns=1)))

    report = result.report
    assert (report.groups_before, report.groups_after) == (13, 4)
    assert (report.messages_before, report.messages_after) == (17, 5)
    assert report.tokens_before == tokens(prompt)
    assert report.tokens_after == tokens(result.messages) == result.total_tokens
    assert report.excluded_message_ids == [f"{k}{i}" for i in range(3) for k in "uatr"]
    assert report.repaired_message_ids == []


async def test_the_same_prompt_compacts_to_the_same_message_ids() -> None:
    spec = ToolResultCompaction(trigger=HasToolCalls())

    first, second = await compact(session(4), spec), await compact(session(4), spec)

    assert ids(first) == ids(second)
    assert first.report.added_message_ids == second.report.added_message_ids != []


async def test_reasoning_before_a_call_goes_with_its_collapsed_group() -> None:
    think = ChatMessage(role="assistant", contents=[ReasoningContent(text="hmm")], message_id="k")
    prompt = [say("user", "Go", "u0"), think, *session(1)[2:], say("user", "Next", "u1")]

    result = await compact(prompt, ToolResultCompaction(trigger=Always(), minimum_preserved=1))

    assert "k" in result.report.excluded_message_ids
    assert [g.kind for g in result.groups] == ["user", "summary", "assistant_text", "user"]


# bad input ------------------------------------------------------------------------------------


async def test_an_empty_prompt_is_a_bad_request() -> None:
    with pytest.raises(EmptyPrompt) as caught:
        await compact([], NoCompaction())

    assert isinstance(caught.value, BadRequest)
    assert caught.value.code == "bad_request"


@pytest.mark.parametrize(
    "spec",
    [
        TruncationCompaction(trigger=TokensExceed(tokens=-1)),
        TruncationCompaction(trigger=Always(), minimum_preserved=-2),
        PipelineCompaction(steps=[]),
        SummarizationCompaction(trigger=Always(), route=""),
    ],
    ids=["negative_tokens", "negative_floor", "empty_pipeline", "blank_route"],
)
async def test_a_spec_breaking_its_constraints_is_a_bad_request_naming_the_field(
    spec: CompactionStrategy,
) -> None:
    with pytest.raises(InvalidStrategy) as caught:
        await compact(session(1), spec)

    assert caught.value.code == "bad_request"
    assert "at `$." in caught.value.message


async def test_a_negative_legacy_budget_is_a_bad_request() -> None:
    with pytest.raises(InvalidStrategy, match="max_tokens is -5"):
        await compact(session(1), max_tokens=-5)


def test_a_context_window_needs_room_for_input_and_ordered_thresholds() -> None:
    with pytest.raises(ValueError, match="max_output"):
        ContextWindowCompaction(max_context=100, max_output=100)
    with pytest.raises(ValueError, match="truncation_threshold"):
        ContextWindowCompaction(
            max_context=100, tool_eviction_threshold=0.9, truncation_threshold=0.5
        )


# config ---------------------------------------------------------------------------------------

AGENT_TOML = """
[compaction]
strategy = "pipeline"
persist = true

[[compaction.steps]]
strategy = "tool_result"
trigger = { condition = "tokens_exceed", tokens = 512 }

[[compaction.steps]]
strategy = "summarization"
route = "scripted/summarizer"
trigger = { condition = "all", of = [
  { condition = "has_tool_calls" }, { condition = "tokens_exceed", tokens = 1280 },
] }

[[compaction.steps]]
strategy = "sliding_window"
trigger = { condition = "turns_exceed", turns = 8 }

[[compaction.steps]]
strategy = "truncation"
trigger = { condition = "tokens_exceed", tokens = 32000 }
minimum_preserved = 10
"""


def test_an_agents_compaction_table_converts_to_the_seed_essays_pipeline() -> None:
    table = tomllib.loads(AGENT_TOML)["compaction"]

    spec = strategy_from_config(table, ignore={"persist"})

    assert spec == PipelineCompaction(
        steps=[
            ToolResultCompaction(trigger=TokensExceed(tokens=512)),
            SummarizationCompaction(
                route="scripted/summarizer",
                trigger=AllOf(of=[HasToolCalls(), TokensExceed(tokens=1280)]),
            ),
            SlidingWindowCompaction(trigger=TurnsExceed(turns=8)),
            TruncationCompaction(trigger=TokensExceed(tokens=32000), minimum_preserved=10),
        ]
    )


@pytest.mark.parametrize(
    ("table", "names"),
    [
        ({"strategy": "truncation", "trigger": {"condition": "soon"}}, "$.trigger.condition"),
        ({"strategy": "shrink"}, "$.strategy"),
        ({"strategy": "truncation"}, "missing required field `trigger`"),
        (
            {"strategy": "truncation", "trigger": {"condition": "always"}, "minimum_preseved": 3},
            "unknown field `minimum_preseved` - at `$`",
        ),
        (
            {
                "strategy": "pipeline",
                "steps": [{"strategy": "truncation", "trigger": {"condition": "never", "n": 1}}],
            },
            "unknown field `n` - at `$.steps[0].trigger`",
        ),
        (
            {"strategy": "truncation", "trigger": {"condition": "turns_exceed", "turns": -1}},
            "at `$.trigger.turns`",
        ),
    ],
    ids=["unknown_trigger", "unknown_strategy", "no_trigger", "typo", "nested_typo", "negative"],
)
def test_a_bad_compaction_table_is_rejected_naming_the_problem(
    table: dict[str, object], names: str
) -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        strategy_from_config(table)

    assert names in str(caught.value)
