"""Hops a run no longer makes: the compaction hop while no trigger can hold, and a tools.list
per run (the catalogue is kept per agent and tenant)."""

import pytest

from runbus.messages import ChatMessage, FunctionCallContent, TextContent, ToolSpec
from runbus.messages.compaction import (
    AllOf,
    AnyOf,
    ContextWindowCompaction,
    HasToolCalls,
    MessagesExceed,
    NoCompaction,
    PipelineCompaction,
    SlidingWindowCompaction,
    TokensBelow,
    TokensExceed,
    ToolResultCompaction,
    TruncationCompaction,
    TurnsExceed,
)
from runbus_compaction.core import MessageIndex
from runbus_gateway.agents import CompactionPolicy
from runbus_gateway.catalog import ToolCatalogCache
from runbus_gateway.run.compaction import PromptSize, may_compact


def said(text: str, role: str = "user") -> ChatMessage:
    return ChatMessage(role=role, contents=[TextContent(text=text)])  # type: ignore[arg-type]


SHORT = [said("You help.", "system"), said("Weather in Sydney?")]
LONG = [*SHORT, said("x" * 4000)]
CALLS = [
    *SHORT,
    ChatMessage(
        role="assistant",
        contents=[FunctionCallContent(call_id="c1", name="get_weather", arguments={})],
    ),
]


@pytest.mark.parametrize(
    ("policy", "prompt", "expected"),
    [
        (CompactionPolicy(), LONG, False),
        (CompactionPolicy(max_tokens=500), SHORT, False),
        (CompactionPolicy(max_tokens=500), LONG, True),
        (CompactionPolicy(strategy=NoCompaction(), max_tokens=None), LONG, False),
        (
            CompactionPolicy(strategy=TruncationCompaction(trigger=TokensExceed(tokens=800))),
            SHORT,
            False,
        ),
        (
            CompactionPolicy(strategy=TruncationCompaction(trigger=TokensExceed(tokens=800))),
            LONG,
            True,
        ),
        (
            CompactionPolicy(strategy=TruncationCompaction(trigger=TokensBelow(tokens=10))),
            SHORT,
            True,
        ),
        (
            CompactionPolicy(strategy=SlidingWindowCompaction(trigger=TurnsExceed(turns=8))),
            SHORT,
            False,
        ),
        (
            CompactionPolicy(strategy=SlidingWindowCompaction(trigger=TurnsExceed(turns=1))),
            LONG,
            True,
        ),
        # One turn of many messages (a step's calls and results): no more turns than users.
        (
            CompactionPolicy(strategy=SlidingWindowCompaction(trigger=TurnsExceed(turns=1))),
            [*CALLS, said("sunny", "tool"), said("It is sunny.", "assistant")],
            False,
        ),
        (
            CompactionPolicy(strategy=SlidingWindowCompaction(trigger=TurnsExceed(turns=1))),
            [*CALLS, said("sunny", "tool"), said("And tomorrow?")],
            True,
        ),
        (CompactionPolicy(strategy=ToolResultCompaction(trigger=HasToolCalls())), SHORT, False),
        (CompactionPolicy(strategy=ToolResultCompaction(trigger=HasToolCalls())), CALLS, True),
        (
            CompactionPolicy(
                strategy=TruncationCompaction(
                    trigger=AllOf(of=[HasToolCalls(), MessagesExceed(messages=1)])
                )
            ),
            LONG,
            False,
        ),
        (
            CompactionPolicy(
                strategy=TruncationCompaction(
                    trigger=AnyOf(of=[HasToolCalls(), MessagesExceed(messages=2)])
                )
            ),
            LONG,
            True,
        ),
        (
            CompactionPolicy(
                strategy=PipelineCompaction(
                    steps=[
                        ToolResultCompaction(trigger=HasToolCalls()),
                        TruncationCompaction(trigger=TokensExceed(tokens=800)),
                    ]
                )
            ),
            LONG,
            True,
        ),
        (CompactionPolicy(strategy=ContextWindowCompaction(max_context=2000)), SHORT, False),
        (CompactionPolicy(strategy=ContextWindowCompaction(max_context=2000)), LONG, True),
    ],
)
def test_the_compaction_hop_is_made_only_when_a_trigger_could_hold(
    policy: CompactionPolicy, prompt: list[ChatMessage], expected: bool
) -> None:
    assert may_compact(policy, prompt) is expected


def test_the_prompt_size_never_undercounts_what_compaction_counts_in_bytes() -> None:
    size = PromptSize(LONG)

    assert size.tokens >= sum(4 + len(m.text.encode()) // 4 for m in LONG)
    assert size.messages == 3


SPEC = ToolSpec(name="get_weather", description="", parameters={"type": "object"})


async def test_the_tool_catalogue_is_asked_once_per_agent_and_tenant_until_forgotten() -> None:
    cache = ToolCatalogCache()
    asked: list[str] = []

    async def fetch() -> list[ToolSpec]:
        asked.append("list")
        return [SPEC]

    key = ("travel", "acme", ("get_weather",))
    first = await cache.get(key, fetch)
    again = await cache.get(key, fetch)
    other_tenant = await cache.get(("travel", "globex", ("get_weather",)), fetch)
    cache.forget("travel", "acme")
    after_forget = await cache.get(key, fetch)

    assert first == again == other_tenant == after_forget == [SPEC]
    assert asked == ["list"] * 3


async def test_an_expired_or_failed_catalogue_is_asked_again() -> None:
    cache = ToolCatalogCache(ttl=0.0)
    asked: list[str] = []

    async def fetch() -> list[ToolSpec]:
        asked.append("list")
        if len(asked) == 1:
            raise RuntimeError("tool executor down")
        return [SPEC]

    key = ("travel", "acme", ("get_weather",))
    with pytest.raises(RuntimeError):
        await cache.get(key, fetch)
    await cache.get(key, fetch)
    await cache.get(key, fetch)

    assert asked == ["list"] * 3


@pytest.mark.parametrize(
    "prompt",
    [
        SHORT,
        LONG,
        CALLS,
        [*CALLS, said("sunny", "tool"), said("It is sunny.", "assistant"), said("And then?")],
        [said("You help.", "system"), said("an orphan answer", "assistant"), said("Hi")],
    ],
)
def test_the_prompt_size_never_undercounts_the_turns_compaction_counts(
    prompt: list[ChatMessage],
) -> None:
    assert PromptSize(prompt).users >= MessageIndex.build(prompt).turns
