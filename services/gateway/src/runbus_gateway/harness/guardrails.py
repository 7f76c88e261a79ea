"""Input guardrails, the outer layer around a whole run: they refuse before any model call.
(Output rewriters are `rewriters.py`; what a user reads of a failure is `user_errors.py`.)

A guardrail is a small tagged Struct registered by name; an agent lists them as tables:

    [harness]
    guardrails = [
      {name = "blocked_terms", terms = ["wire the money", "jailbreak"]},
      {name = "pii", kinds = ["password", "credit_card"]},
      {name = "max_input_size", max_chars = 4000},
    ]
"""

import functools
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Final, Literal, get_args

import msgspec

from runbus.messages import ChatMessage

from ._registry import Registry, plugin_name


class Refusal(msgspec.Struct, kw_only=True, frozen=True):
    """A guardrail's verdict: the run ends with `text` as the assistant's answer."""

    text: str
    """The final assistant text the user reads."""
    guardrail: str
    """Name of the guardrail that refused."""
    reason: str
    """Why, for logs and spans; never the matched secret itself."""


class Guardrail(
    msgspec.Struct,
    kw_only=True,
    frozen=True,
    forbid_unknown_fields=True,
    tag_field="name",
    dict=True,  # room for compiled patterns (functools.cached_property)
):
    """An input check. Subclasses are tagged with their name and registered with `@guardrail`."""

    def check(self, inputs: Sequence[ChatMessage]) -> Refusal | None:
        raise NotImplementedError

    def refuse(self, text: str, reason: str) -> Refusal:
        return Refusal(text=text, guardrail=plugin_name(self), reason=reason)


GUARDRAILS: Final = Registry("guardrail", Guardrail)
guardrail = GUARDRAILS.register


def _texts(inputs: Sequence[ChatMessage]) -> Iterator[str]:
    return (message.text for message in inputs if message.text)


@guardrail
class BlockedTerms(Guardrail, frozen=True, tag="blocked_terms"):
    """Refuses input containing any of `terms`, ignoring case. A term of several words matches
    with any whitespace between them. With `whole_words` (default) a term matches only as whole
    words, so `arms` does not match `farmstay`; turn it off for scripts written without spaces."""

    terms: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
    """Words or phrases that end the run."""
    message: str = "Sorry, I can't help with that request."
    """What the user reads."""
    whole_words: bool = True
    """Match at word boundaries only."""

    @functools.cached_property
    def patterns(self) -> list[tuple[str, re.Pattern[str]]]:
        compiled = []
        for term in self.terms:
            body = r"\s+".join(re.escape(word) for word in term.split())
            if self.whole_words:
                body = rf"(?<!\w){body}(?!\w)"
            compiled.append((term, re.compile(body, re.IGNORECASE)))
        return compiled

    def check(self, inputs: Sequence[ChatMessage]) -> Refusal | None:
        for text in _texts(inputs):
            for term, pattern in self.patterns:
                if pattern.search(text):
                    return self.refuse(self.message, f"blocked term {term!r}")
        return None


PiiKind = Literal["password", "passport", "national_id", "credit_card"]
PII_KINDS: Final[tuple[PiiKind, ...]] = get_args(PiiKind)

_PASSWORD: Final = re.compile(
    r"\b(?:password|passwd|pwd|passcode|passphrase)\b\s*(?:is|was|[:=])\s*\S{4,}"
    r"|密码\s*(?:是|为|[:\uff1a=])\s*\S{4,}",
    re.IGNORECASE,
)
_PASSPORT: Final = re.compile(
    r"(?:\bpassport|护照)\s*(?:number|no\.?|num|#|号码?)?\s*(?:is|[:\uff1a=#])?\s*"
    r"(?P<number>[A-Z0-9]{6,9})(?![A-Z0-9])",
    re.IGNORECASE,
)
_SSN: Final = re.compile(r"(?<!\d)(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?!\d)")
_CN_RESIDENT_ID: Final = re.compile(r"(?<![0-9A-Za-z])\d{17}[\dXx](?![0-9A-Za-z])")
_ID_KEYWORD: Final = re.compile(
    r"\b(?:ssn|social\s+security(?:\s+number)?|national\s+id(?:entity)?(?:\s+number)?"
    r"|id(?:entity)?\s+(?:card\s+)?number|tax\s+file\s+number|tfn)\b"
    r"\s*(?:is|[:=#])?\s*(?P<number>[A-Z0-9][A-Z0-9 -]{4,18}[A-Z0-9])",
    re.IGNORECASE,
)
_CARD: Final = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
_CN_ID_WEIGHTS: Final = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK: Final = "10X98765432"


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _cn_resident_id(number: str) -> bool:
    total = sum(int(d) * w for d, w in zip(number[:17], _CN_ID_WEIGHTS, strict=True))
    return _CN_ID_CHECK[total % 11] == number[17].upper()


def find_pii(text: str, kinds: Sequence[PiiKind] = PII_KINDS) -> PiiKind | None:
    """The first kind of personal secret `text` appears to contain (see `Pii` for the rules)."""
    if "password" in kinds and _PASSWORD.search(text):
        return "password"
    if "passport" in kinds:
        for found in _PASSPORT.finditer(text):
            if any(char.isdigit() for char in found["number"]):
                return "passport"
    if "national_id" in kinds:
        if _SSN.search(text) or any(_cn_resident_id(m[0]) for m in _CN_RESIDENT_ID.finditer(text)):
            return "national_id"
        for found in _ID_KEYWORD.finditer(text):
            if sum(char.isdigit() for char in found["number"]) >= 5:
                return "national_id"
    if "credit_card" in kinds:
        for found in _CARD.finditer(text):
            digits = re.sub(r"[ -]", "", found[0])
            if 13 <= len(digits) <= 19 and _luhn(digits):
                return "credit_card"
    return None


@guardrail
class Pii(Guardrail, frozen=True, tag="pii"):
    """Refuses input that carries a personal secret, so it never reaches a model, memory or
    history. What counts, by kind:

    - `password`: `password`, `passwd`, `pwd`, `passcode` or `passphrase` followed by `is`,
      `was`, `:` or `=` and a token of 4+ characters (`my password is hunter22`); `密码是…`.
    - `passport`: `passport` (optionally `number`/`no`/`#`) followed by 6-9 letters and digits
      that include a digit (`passport no. PA1234567`); `护照号…`.
    - `national_id`: a US social security number `123-45-6789` (not 000/666/9xx areas); an
      18-character Chinese resident identity number with a valid check digit; or a keyword
      (`SSN`, `national id`, `ID number`, `identity card number`, `tax file number`, `TFN`)
      followed by a number with at least 5 digits.
    - `credit_card`: 13-19 digits, optionally grouped by spaces or dashes, that pass the Luhn
      check (`4111 1111 1111 1111`).

    Patterns err towards refusing: "the password is required" is refused too.
    """

    kinds: Annotated[list[PiiKind], msgspec.Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: list(PII_KINDS)
    )
    """Kinds to look for."""
    message: str = (
        "Please don't share passwords, passport, ID or card numbers here. "
        "Remove them and ask again."
    )
    """What the user reads."""

    def check(self, inputs: Sequence[ChatMessage]) -> Refusal | None:
        for text in _texts(inputs):
            kind = find_pii(text, self.kinds)
            if kind is not None:
                return self.refuse(self.message, f"personal data: {kind}")
        return None


def _check_placeholders(template: str, allowed: frozenset[str]) -> None:
    for _, field, spec, conversion in string.Formatter().parse(template):
        if field is not None and (field not in allowed or spec or conversion):
            raise ValueError(
                f"{template!r} uses {{{field}}}; allowed: {', '.join(sorted(allowed))}"
            )


@guardrail
class MaxInputSize(Guardrail, frozen=True, tag="max_input_size"):
    """Refuses input whose text is longer than `max_chars` characters in total."""

    max_chars: Annotated[int, msgspec.Meta(ge=1)]
    """Characters of text over all input messages."""
    message: str = (
        "That message is too long for me ({size} characters; the limit is {limit}). "
        "Please shorten it."
    )
    """What the user reads; `{size}` and `{limit}` are filled in."""

    def __post_init__(self) -> None:
        _check_placeholders(self.message, frozenset({"size", "limit"}))

    def check(self, inputs: Sequence[ChatMessage]) -> Refusal | None:
        size = sum(len(text) for text in _texts(inputs))
        if size <= self.max_chars:
            return None
        return self.refuse(
            self.message.format(size=size, limit=self.max_chars),
            f"input of {size} characters over {self.max_chars}",
        )


def build_guardrails(tables: Sequence[Mapping[str, Any]]) -> list[Guardrail]:
    """Guardrails from an agent's tables; `GatewayConfigError` names an unknown one."""
    return GUARDRAILS.build(tables)


def check(guardrails: Sequence[Guardrail], inputs: Sequence[ChatMessage]) -> Refusal | None:
    """The first refusal of `guardrails`, in the order configured; None lets the run go on."""
    for one in guardrails:
        refusal = one.check(inputs)
        if refusal is not None:
            return refusal
    return None
