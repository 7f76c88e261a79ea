"""Properties of every compaction, for random histories and random strategy specs: the result is a
list a provider accepts, every system message is kept, and the newest groups above the floor are
untouched, whatever the strategy, the thresholds, or the summariser's fate."""

import itertools
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runbus.errors import ModelError
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    Role,
    TextContent,
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
)
from runbus_compaction.core import MessageIndex, is_reasoning_only
from runbus_compaction.strategies import Compaction, SummaryCall, SummaryReply, compact
from runbus_compaction.tokens import estimate_tokens

T = TypeVar("T")
Fate = Literal["text", "blank", "fails"]

PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never waits on anything (the fake summariser answers at once)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise AssertionError("the compaction waited on something outside the test")


# Histories ------------------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn, *, messy: bool) -> list[ChatMessage]:
    """A conversation of user turns, plain and tool-calling replies (parallel calls, results in
    any order, some arriving late), reasoning, system messages anywhere and earlier summaries.
    `messy` adds what a provider would reject: results without a call, calls never answered,
    a second result for an answered call."""
    numbers = itertools.count()
    messages: list[ChatMessage] = []
    late: list[ChatMessage] = []

    def message(role: Role, contents: list[Any], source: str = "external") -> ChatMessage:
        return ChatMessage(
            role=role,
            contents=contents,
            message_id=f"m{next(numbers)}",
            source=source,  # type: ignore[arg-type]
        )

    def text(role: Role, source: str = "external") -> ChatMessage:
        size = draw(st.integers(0, 600))
        return message(role, [TextContent(text="w" * size)], source)

    def tool_round() -> None:
        if draw(st.booleans()):
            messages.append(message("assistant", [ReasoningContent(text="think")]))
        call_ids = [f"c{next(numbers)}" for _ in range(draw(st.integers(1, 3)))]
        messages.append(
            message(
                "assistant",
                [
                    FunctionCallContent(
                        call_id=c, name=draw(st.sampled_from(["get_weather", "search"]))
                    )
                    for c in call_ids
                ],
            )
        )
        answered = call_ids
        if messy and draw(st.booleans()):
            answered = call_ids[1:]  # the first call is never answered
        results = [
            FunctionResultContent(call_id=c, result="r" * draw(st.integers(0, 2000)))
            for c in answered
        ]
        order = draw(st.permutations(results))
        layout = draw(st.sampled_from(["one_message", "one_each", "one_late"]))
        if layout == "one_message" and order:
            messages.append(message("tool", list(order)))
        else:
            for position, result in enumerate(order):
                answer = message("tool", [result])
                if layout == "one_late" and position == len(order) - 1:
                    late.append(answer)
                else:
                    messages.append(answer)
        if draw(st.booleans()):
            messages.append(message("assistant", [ReasoningContent(text="done")]))
        if messy and draw(st.integers(0, 4)) == 0 and answered:
            messages.append(message("tool", [FunctionResultContent(call_id=answered[0])]))

    if draw(st.booleans()):
        messages.append(text("system"))
    if draw(st.booleans()):
        messages.append(text("assistant"))  # before the first user message: turn 0
    for _ in range(draw(st.integers(0, 7))):
        messages.append(text("user"))
        messages.extend(late)
        late.clear()
        for _ in range(draw(st.integers(0, 3))):
            match draw(st.sampled_from(["text", "tools", "system", "summary", "orphan"])):
                case "text":
                    messages.append(text("assistant"))
                case "tools":
                    tool_round()
                case "system":
                    messages.append(text("system"))
                    messages.extend(late)
                    late.clear()
                case "summary":
                    messages.append(text("assistant", source="compaction"))
                case "orphan" if messy:
                    messages.append(message("tool", [FunctionResultContent(call_id="ghost")]))
                case _:
                    pass
    messages.extend(late)
    if not messages:
        messages.append(text("user"))
    return messages


# Specs ----------------------------------------------------------------------------------------

floors = st.integers(0, 6)
leaf_triggers: st.SearchStrategy[Trigger] = st.one_of(
    st.builds(Always),
    st.builds(Never),
    st.builds(TokensExceed, tokens=st.integers(0, 4000)),
    st.builds(TokensBelow, tokens=st.integers(0, 4000)),
    st.builds(MessagesExceed, messages=st.integers(0, 40)),
    st.builds(TurnsExceed, turns=st.integers(0, 8)),
    st.builds(GroupsExceed, groups=st.integers(0, 40)),
    st.builds(HasToolCalls),
)
triggers: st.SearchStrategy[Trigger] = st.recursive(
    leaf_triggers,
    lambda inner: st.one_of(
        st.builds(AllOf, of=st.lists(inner, min_size=1, max_size=3)),
        st.builds(AnyOf, of=st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=4,
)
targets = st.none() | triggers
steps: st.SearchStrategy[CompactionStrategy] = st.one_of(
    st.builds(
        ToolResultCompaction,
        trigger=triggers,
        target=targets,
        minimum_preserved=floors,
        max_result_chars=st.none() | st.integers(0, 300),
    ),
    st.builds(SummarizationCompaction, trigger=triggers, target=targets, minimum_preserved=floors),
    st.builds(SlidingWindowCompaction, trigger=triggers, target=targets, minimum_preserved=floors),
    st.builds(TruncationCompaction, trigger=triggers, target=targets, minimum_preserved=floors),
)


@st.composite
def context_windows(draw: st.DrawFn) -> ContextWindowCompaction:
    max_context = draw(st.integers(1, 8000))
    eviction = draw(st.floats(0.01, 1.0))
    return ContextWindowCompaction(
        max_context=max_context,
        max_output=draw(st.integers(0, max_context - 1)),
        tool_eviction_threshold=eviction,
        truncation_threshold=draw(st.floats(eviction, 1.0)),
        minimum_preserved=draw(floors),
    )


specs: st.SearchStrategy[CompactionStrategy] = st.one_of(
    st.builds(NoCompaction),
    steps,
    context_windows(),
    st.builds(PipelineCompaction, steps=st.lists(steps, min_size=1, max_size=4)),
)


def floor_of(spec: CompactionStrategy, max_tokens: int | None) -> int:
    """Newest non-system groups no step of `spec` may touch. A sliding window's floor counts
    turns, and the newest N turns hold at least the newest N groups."""
    match spec:
        case NoCompaction():
            return 2 if max_tokens is not None else 1_000_000
        case PipelineCompaction(steps=inner):
            return min(floor_of(s, None) for s in inner)
        case _:
            return spec.minimum_preserved


def summariser(fate: Fate) -> Any:
    async def summarize(call: SummaryCall) -> SummaryReply:
        if fate == "fails":
            raise ModelError("the cheap model is down")
        return SummaryReply(text="a summary" if fate == "text" else " ")

    return summarize


# The properties -------------------------------------------------------------------------------


def assert_valid_provider_list(messages: list[ChatMessage]) -> None:
    """Every tool message answers calls of the assistant message before it (only tool messages
    and reasoning between them), every call is answered before anything else is said, and no
    message is empty."""
    waiting: set[str] | None = None
    for position, message in enumerate(messages):
        where = f"message {position} ({message.role}, {message.message_id})"
        assert message.contents, f"{where} is empty"
        if message.role == "tool":
            assert waiting is not None, f"{where} answers no call"
            assert message.function_results, f"{where} carries no result"
            for result in message.function_results:
                assert result.call_id in waiting, f"{where} answers unknown {result.call_id}"
                waiting.remove(result.call_id)
        elif message.role == "assistant" and waiting and is_reasoning_only(message):
            continue
        else:
            assert not waiting, f"{where} comes before the results of {waiting}"
            calls = [c.call_id for c in message.function_calls]
            assert len(calls) == len(set(calls)), f"{where} repeats a call id"
            waiting = set(calls) if calls else None
    assert not waiting, f"calls {waiting} are never answered"


def assert_compaction_properties(prompt: list[ChatMessage], result: Compaction, floor: int) -> None:
    assert_valid_provider_list(result.messages)

    system_in = [m for m in prompt if m.role == "system"]
    assert [m for m in result.messages if m.role == "system"] == system_in

    reference = MessageIndex.build(prompt).included()
    newest = [g for g in reference if g.kind != "system"][-floor:] if floor else []
    intact = [m for g in newest for m in g.messages if m.role != "system"]
    kept = [m for m in result.messages if m.role != "system"]
    assert kept[len(kept) - len(intact) :] == intact, "a group above the floor was touched"

    turn_zero = [m for g in reference if g.turn == 0 for m in g.messages]
    assert all(m in result.messages for m in turn_zero), "turn 0 was touched"

    if sum(1 for g in reference if g.kind != "system") <= 1:
        assert result.messages == MessageIndex.build(prompt).output()

    report = result.report
    assert report.tokens_after == sum(estimate_tokens(m) for m in result.messages)
    assert report.messages_after == len(result.messages)
    assert report.groups_after == len(result.groups)
    assert sum(g.count for g in result.groups) == len(result.messages)
    output_ids = {m.message_id for m in result.messages}
    assert not output_ids & set(report.excluded_message_ids)
    assert output_ids <= {m.message_id for m in prompt} | set(report.added_message_ids)


@PROPERTY_SETTINGS
@given(
    prompt=histories(messy=False),
    spec=specs,
    fate=st.sampled_from(["text", "blank", "fails"]),
    max_tokens=st.none() | st.integers(0, 5000),
)
def test_any_strategy_on_a_valid_history_keeps_it_valid_with_system_and_floor_intact(
    prompt: list[ChatMessage], spec: CompactionStrategy, fate: Fate, max_tokens: int | None
) -> None:
    repaired = MessageIndex.build(prompt).output()
    # A valid history needs no repair beyond moving a late result next to its call.
    assert sorted(m.message_id for m in repaired) == sorted(m.message_id for m in prompt)
    assert_valid_provider_list(repaired)

    result = run_now(compact(prompt, spec, summarize=summariser(fate), max_tokens=max_tokens))

    assert_compaction_properties(prompt, result, floor_of(spec, max_tokens))


@PROPERTY_SETTINGS
@given(
    prompt=histories(messy=True),
    spec=specs,
    fate=st.sampled_from(["text", "blank", "fails"]),
)
def test_any_strategy_on_a_messy_history_returns_a_list_a_provider_accepts(
    prompt: list[ChatMessage], spec: CompactionStrategy, fate: Fate
) -> None:
    result = run_now(compact(prompt, spec, summarize=summariser(fate)))

    assert_compaction_properties(prompt, result, floor_of(spec, None))


@PROPERTY_SETTINGS
@given(prompt=histories(messy=False), spec=steps)
def test_a_failed_summary_never_leaves_a_half_compacted_list(
    prompt: list[ChatMessage], spec: CompactionStrategy
) -> None:
    if not isinstance(spec, SummarizationCompaction):
        spec = SummarizationCompaction(trigger=Always(), minimum_preserved=1)

    result = run_now(compact(prompt, spec, summarize=summariser("fails")))

    assert result.messages == MessageIndex.build(prompt).output()
    assert not result.compacted
