"""Program agents: a Python class answers instead of a model; the example is a refund-policy
rule engine that asks for missing facts and keeps them in the state bag."""

from typing import Any

import pytest

from runbus.headers import RunContext
from runbus.messages import ChatMessage, FunctionCallContent, TextContent
from runbus_examples.refund import RefundPolicyAgent, read_facts
from runbus_gateway.errors import GatewayConfigError
from runbus_gateway.harness.errors import ProgramError
from runbus_gateway.harness.programs import (
    ProgramReply,
    ProgramRun,
    load_program,
    run_program,
    say,
)
from runbus_gateway.harness.state import SessionState
from tests.unit.test_harness_state import SessionStore

CTX = RunContext(run_id="r-1", session_id="s1", agent="refunds")


def run_of(text: str, state: dict[str, Any] | None = None) -> ProgramRun:
    return ProgramRun(
        run_id="r-1",
        session_id="s1",
        agent="refunds",
        user_id="alice",
        tenant="acme",
        inputs=[ChatMessage(role="user", contents=[TextContent(text=text)])],
        history=[],
        state=state or {},
    )


async def ask(agent: RefundPolicyAgent, *turns: str) -> list[str]:
    """What the agent answers to each turn, carrying its state between turns."""
    state: dict[str, Any] = {}
    answers = []
    for turn in turns:
        reply = await agent.respond(run_of(turn, state))
        answers.append(reply.messages[-1].text)
        state.update(reply.state)
    return answers


@pytest.mark.parametrize(
    ("text", "outcome"),
    [
        ("Refund my electronics, bought 12 days ago for $120, I have the receipt", "full"),
        ("clothing bought 2 weeks ago, no receipt, $40", "store credit"),
        ("books bought 45 days ago with receipt, $30", "partial $15.00"),
        ("toys bought 45 days ago, lost the receipt", "refused: receipt"),
        ("furniture bought 4 months ago with receipt", "refused: late"),
        ("a gift card I bought yesterday, receipt in hand", "refused: category"),
    ],
)
async def test_the_refund_rules_decide_the_same_way_every_time(text: str, outcome: str) -> None:
    agent = RefundPolicyAgent()

    [answer] = await ask(agent, text)
    [again] = await ask(agent, text)

    assert answer == again
    expected = {
        "full": "Refund approved: a full refund of $120.00",
        "store credit": "store credit for $40.00",
        "partial $15.00": "Partial refund approved: $15.00 back (50%)",
        "refused: receipt": "a refund needs the receipt",
        "refused: late": "refunds end after 90 days",
        "refused: category": "gift card purchases cannot be refunded",
    }[outcome]
    assert expected in answer


async def test_missing_facts_are_asked_for_one_at_a_time_and_remembered() -> None:
    answers = await ask(RefundPolicyAgent(), "I want a refund", "electronics", "10", "yes")

    assert answers[:3] == [
        "What kind of item is it (for example electronics, clothing, books)?",
        "How many days ago did you buy it?",
        "Do you have the receipt?",
    ]
    assert answers[3].startswith("Refund approved: a full refund of the purchase price")


async def test_a_decision_closes_the_case_so_the_next_request_starts_afresh() -> None:
    agent = RefundPolicyAgent()
    first = await agent.respond(run_of("electronics 3 days ago with receipt"))

    second = await agent.respond(run_of("and another one", first.state))

    assert first.state == {
        "refund": {
            "facts": {"category": None, "days": None, "receipt": None, "amount": None},
            "asked": None,
            "last_outcome": "full_refund",
        }
    }
    assert second.messages[-1].text.startswith("What kind of item")


def test_facts_are_read_from_plain_words() -> None:
    facts = read_facts("Bought 3 weeks ago, 89.50 dollars, I don't have a receipt", None, ["toys"])

    assert (facts.days, facts.amount, facts.receipt, facts.category) == (21, 89.5, False, None)


def test_the_refund_policy_is_configured_through_program_options() -> None:
    agent = load_program(
        "runbus_examples.refund:RefundPolicyAgent",
        {"window_days": 14, "excluded_categories": ["software"]},
    )

    assert isinstance(agent, RefundPolicyAgent)
    assert agent.window_days == 14
    with pytest.raises(GatewayConfigError, match="bad program_options"):
        load_program("runbus_examples.refund:RefundPolicyAgent", {"window": 14})
    with pytest.raises(GatewayConfigError, match="window_days <= partial_window_days"):
        load_program("runbus_examples.refund:RefundPolicyAgent", {"window_days": 120})


class Echo:
    def __init__(self, reply: Any) -> None:
        self.reply = reply

    async def respond(self, run: ProgramRun) -> Any:
        return self.reply


async def test_run_program_stores_state_changes_and_returns_external_messages() -> None:
    store = SessionStore()
    program = Echo(ProgramReply(messages=[say("ok")], state={"counter": 1, "gone": None}))
    store.put("gone", "x")
    state = SessionState(store, CTX, store.record)

    messages = await run_program(program, "echo", run_of("hi"), state)

    assert [(m.role, m.text, m.source) for m in messages] == [("assistant", "ok", "external")]
    assert store.record.state == {"counter": 1}


@pytest.mark.parametrize(
    ("reply", "complaint"),
    [
        ("ok", "returned str, not ProgramReply"),
        (ProgramReply(messages=[]), "returned no message"),
        (
            ProgramReply(messages=[ChatMessage(role="user", contents=[TextContent(text="x")])]),
            "assistant messages",
        ),
        (
            ProgramReply(
                messages=[
                    ChatMessage(
                        role="assistant",
                        contents=[FunctionCallContent(call_id="c", name="get_weather")],
                    )
                ]
            ),
            "without calls",
        ),
        (ProgramReply(messages=[say("ok")], state={"bad key!": 1}), "not a valid key"),
    ],
)
async def test_a_program_that_breaks_the_contract_fails_with_a_typed_error(
    reply: Any, complaint: str
) -> None:
    store = SessionStore()

    with pytest.raises(ProgramError, match=complaint) as raised:
        await run_program(Echo(reply), "echo", run_of("hi"), SessionState(store, CTX, store.record))

    assert raised.value.code == "program_error"
    assert store.writes == 0
