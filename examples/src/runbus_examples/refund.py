"""An example program agent: a deterministic refund-policy rule engine.

It reads the facts of a refund request from what the user writes (category, days since the
purchase, receipt, amount), asks for what is missing one question at a time, keeps the facts
gathered so far in the session's state bag (key `refund`), and decides by fixed rules:

1. a category in `excluded_categories` is never refunded;
2. after `partial_window_days` days: no refund;
3. within `window_days` days: a full refund with a receipt, store credit without one;
4. between the two: `partial_percent` % back with a receipt, nothing without one.

No model is called; the same words always get the same answer.
"""

import re
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from runbus_gateway.harness.programs import ProgramReply, ProgramRun, say

STATE_KEY: Final = "refund"
Fact = Literal["category", "days", "receipt"]
Outcome = Literal["full_refund", "partial_refund", "store_credit", "refused"]

QUESTIONS: Final[dict[Fact, str]] = {
    "category": "What kind of item is it (for example electronics, clothing, books)?",
    "days": "How many days ago did you buy it?",
    "receipt": "Do you have the receipt?",
}
CATEGORIES: Final = (
    "electronics",
    "clothing",
    "books",
    "toys",
    "furniture",
    "gift card",
    "perishable food",
    "digital download",
)
_UNITS: Final = {"day": 1, "week": 7, "month": 30}
_DAYS: Final = re.compile(r"\b(\d{1,4})\s*(day|week|month)s?\b", re.IGNORECASE)
_WORD_DAYS: Final = {"today": 0, "yesterday": 1, "last week": 7, "last month": 30}
_NO_RECEIPT: Final = re.compile(
    r"\b(?:no|without|lost|don'?t have|do not have|haven'?t got|never got)\b[^.?!]{0,20}"
    r"\breceipt",
    re.IGNORECASE,
)
_RECEIPT: Final = re.compile(r"\breceipt\b", re.IGNORECASE)
_YES: Final = re.compile(r"^\s*(?:yes|yep|yeah|sure|i do|i have)\b", re.IGNORECASE)
_NO: Final = re.compile(r"^\s*(?:no|nope|i don'?t|i do not)\b", re.IGNORECASE)
_AMOUNT: Final = re.compile(
    r"(?:[$€£]\s?|\b(?:usd|aud|eur)\s?)(\d+(?:\.\d{1,2})?)"
    r"|\b(\d+(?:\.\d{1,2})?)\s?(?:dollars|usd|aud|eur)\b",
    re.IGNORECASE,
)
_NUMBER: Final = re.compile(r"^\s*(\d{1,4})\s*$")


class RefundFacts(msgspec.Struct, kw_only=True, frozen=True):
    category: str | None = None
    days: int | None = None
    receipt: bool | None = None
    amount: float | None = None


class RefundCase(msgspec.Struct, kw_only=True, frozen=True):
    """What the session's state bag keeps under `refund` between turns."""

    facts: RefundFacts = RefundFacts()
    asked: Fact | None = None
    """The question the agent asked last, so a bare answer ("12", "yes") is understood."""
    last_outcome: Outcome | None = None


class Decision(msgspec.Struct, kw_only=True, frozen=True):
    outcome: Outcome
    text: str


def read_facts(text: str, asked: Fact | None, categories: Sequence[str]) -> RefundFacts:
    """The facts one user message states; a bare answer fills in the fact last asked for."""
    lowered = text.lower()
    category = next((c for c in categories if re.search(rf"\b{re.escape(c)}s?\b", lowered)), None)
    if category is None and asked == "category" and text.strip():
        category = "other"
    days: int | None = None
    if found := _DAYS.search(text):
        days = int(found[1]) * _UNITS[found[2].lower()]
    elif word := next((w for w in _WORD_DAYS if w in lowered), None):
        days = _WORD_DAYS[word]
    elif asked == "days" and (bare := _NUMBER.match(text)):
        days = int(bare[1])
    receipt: bool | None = None
    if _NO_RECEIPT.search(text):
        receipt = False
    elif _RECEIPT.search(text):
        receipt = True
    elif asked == "receipt":
        receipt = True if _YES.match(text) else False if _NO.match(text) else None
    amount: float | None = None
    if found := _AMOUNT.search(text):
        amount = float(found[1] or found[2])
    return RefundFacts(category=category, days=days, receipt=receipt, amount=amount)


def merged(old: RefundFacts, new: RefundFacts) -> RefundFacts:
    """Facts stated now win over facts stated earlier."""
    return RefundFacts(
        category=new.category if new.category is not None else old.category,
        days=new.days if new.days is not None else old.days,
        receipt=new.receipt if new.receipt is not None else old.receipt,
        amount=new.amount if new.amount is not None else old.amount,
    )


class RefundPolicyAgent:
    """The refund policy as a program agent (see the module docstring for the rules)."""

    def __init__(
        self,
        *,
        window_days: int = 30,
        partial_window_days: int = 90,
        partial_percent: int = 50,
        excluded_categories: Sequence[str] = ("gift card", "perishable food", "digital download"),
        categories: Sequence[str] = CATEGORIES,
    ) -> None:
        if not 0 < window_days <= partial_window_days:
            raise ValueError("need 0 < window_days <= partial_window_days")
        if not 0 < partial_percent < 100:
            raise ValueError("partial_percent must be between 1 and 99")
        self.window_days = window_days
        self.partial_window_days = partial_window_days
        self.partial_percent = partial_percent
        self.excluded = tuple(c.lower() for c in excluded_categories)
        self.categories = tuple(dict.fromkeys([*categories, *self.excluded]))

    async def respond(self, run: ProgramRun) -> ProgramReply:
        case = msgspec.convert(run.state.get(STATE_KEY) or {}, RefundCase)
        facts = merged(case.facts, read_facts(run.text, case.asked, self.categories))
        decision = self.decide(facts)
        if isinstance(decision, Decision):
            closed = RefundCase(last_outcome=decision.outcome)
            return ProgramReply(messages=[say(decision.text)], state=_stored(closed))
        question = QUESTIONS[decision]
        waiting = RefundCase(facts=facts, asked=decision, last_outcome=case.last_outcome)
        return ProgramReply(messages=[say(question)], state=_stored(waiting))

    def decide(self, facts: RefundFacts) -> Decision | Fact:
        """The decision, or the fact still needed to make it."""
        if facts.category is None:
            return "category"
        if facts.category in self.excluded:
            return Decision(
                outcome="refused",
                text=f"Sorry, {facts.category} purchases cannot be refunded under our policy.",
            )
        if facts.days is None:
            return "days"
        if facts.days > self.partial_window_days:
            return Decision(
                outcome="refused",
                text=(
                    f"Sorry, the purchase was {facts.days} days ago; refunds end after "
                    f"{self.partial_window_days} days."
                ),
            )
        if facts.receipt is None:
            return "receipt"
        price = f"${facts.amount:.2f}" if facts.amount is not None else "the purchase price"
        if facts.days <= self.window_days:
            if facts.receipt:
                return Decision(
                    outcome="full_refund",
                    text=(
                        f"Refund approved: a full refund of {price} (bought {facts.days} days "
                        f"ago, within {self.window_days} days, with a receipt)."
                    ),
                )
            return Decision(
                outcome="store_credit",
                text=(
                    f"Without a receipt we can offer store credit for {price} instead of a refund."
                ),
            )
        if not facts.receipt:
            return Decision(
                outcome="refused",
                text=(
                    f"Sorry, after {self.window_days} days a refund needs the receipt, and "
                    "there is none."
                ),
            )
        part = (
            f"${facts.amount * self.partial_percent / 100:.2f}"
            if facts.amount is not None
            else f"{self.partial_percent}% of the purchase price"
        )
        return Decision(
            outcome="partial_refund",
            text=(
                f"Partial refund approved: {part} back ({self.partial_percent}%), since the "
                f"purchase was {facts.days} days ago, after the {self.window_days}-day window."
            ),
        )


def _stored(case: RefundCase) -> dict[str, Any]:
    return {STATE_KEY: msgspec.to_builtins(case)}
