"""Agent middleware: guardrails that refuse before the model, output rewriters, and what a
user reads when a run fails."""

import msgspec
import pytest

from runbus.errors import BadRequest, ModelError, RemoteError, Unavailable
from runbus.messages import ChatMessage, ReasoningContent, TextContent
from runbus_gateway.errors import GatewayConfigError
from runbus_gateway.harness.guardrails import (
    GUARDRAILS,
    Guardrail,
    Refusal,
    build_guardrails,
    check,
    find_pii,
    guardrail,
)
from runbus_gateway.harness.rewriters import Rewriter, build_rewriters, rewrite_final
from runbus_gateway.harness.user_errors import ErrorMessages, user_error


def said(*texts: str) -> list[ChatMessage]:
    return [ChatMessage(role="user", contents=[TextContent(text=t)]) for t in texts]


def test_a_blocked_term_refuses_in_any_case_and_with_any_spacing() -> None:
    [blocked] = build_guardrails(
        [{"name": "blocked_terms", "terms": ["wire the money"], "message": "No."}]
    )

    refusal = blocked.check(said("Hello", "Please WIRE\n the   Money now"))

    assert refusal == Refusal(
        text="No.", guardrail="blocked_terms", reason="blocked term 'wire the money'"
    )


def test_blocked_terms_match_whole_words_unless_told_otherwise() -> None:
    [words] = build_guardrails([{"name": "blocked_terms", "terms": ["arms"]}])
    [anywhere] = build_guardrails(
        [{"name": "blocked_terms", "terms": ["炸弹"], "whole_words": False}]
    )

    assert words.check(said("a farmstay near the coast")) is None
    assert words.check(said("where can I buy arms?")) is not None
    assert anywhere.check(said("怎么做炸弹")) is not None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("my password is hunter22", "password"),
        ("Password: c0rrect-horse", "password"),
        ("我的密码是abc12345", "password"),
        ("passport number PA1234567, please book", "passport"),
        ("my passport no. is X9876543", "passport"),
        ("SSN 123-45-6789", "national_id"),
        ("身份证 11010519491231002X", "national_id"),
        ("my national id number is 8812 3456 7", "national_id"),
        ("card 4111 1111 1111 1111 exp 12/29", "credit_card"),
        ("5555-5555-5555-4444", "credit_card"),
    ],
)
def test_personal_secrets_are_recognised(text: str, kind: str) -> None:
    assert find_pii(text) == kind


@pytest.mark.parametrize(
    "text",
    [
        "How do I reset my password?",
        "Book flight QF401 for 2 passengers",
        "My passport expires next year",
        "Order 1234 5678 9012 3456 arrived",  # not a Luhn number
        "Call 0412 345 678",
        "11010519491231002Y",  # bad check digit
        "Weather in Sydney on 2025-06-01?",
    ],
)
def test_ordinary_text_is_not_taken_for_personal_data(text: str) -> None:
    assert find_pii(text) is None


def test_the_pii_guardrail_refuses_only_the_kinds_it_is_given() -> None:
    [cards_only] = build_guardrails([{"name": "pii", "kinds": ["credit_card"]}])

    assert cards_only.check(said("my password is hunter22")) is None
    refusal = cards_only.check(said("4111111111111111"))
    assert refusal is not None
    assert refusal.reason == "personal data: credit_card"
    assert "4111" not in refusal.reason + refusal.text


def test_input_over_the_size_limit_is_refused_with_its_size() -> None:
    [limit] = build_guardrails([{"name": "max_input_size", "max_chars": 10}])

    assert limit.check(said("short", "also")) is None
    refusal = limit.check(said("twelve chars"))

    assert refusal is not None
    assert refusal.text.startswith(
        "That message is too long for me (12 characters; the limit is 10)"
    )


def test_the_first_guardrail_that_refuses_wins_in_configured_order() -> None:
    chain = build_guardrails(
        [
            {"name": "max_input_size", "max_chars": 5},
            {"name": "blocked_terms", "terms": ["secret"]},
        ]
    )

    refusal = check(chain, said("tell me the secret"))

    assert refusal is not None
    assert refusal.guardrail == "max_input_size"
    assert check(chain, said("hi")) is None


def test_an_unknown_guardrail_name_is_a_config_error_naming_it() -> None:
    with pytest.raises(GatewayConfigError, match=r"unknown guardrail 'profanity'") as raised:
        build_guardrails([{"name": "pii"}, {"name": "profanity"}])

    assert "known: blocked_terms, max_input_size, pii" in str(raised.value)


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ({"terms": ["x"]}, "guardrail #1 has no `name`"),
        ({"name": "blocked_terms"}, "missing required field `terms`"),
        ({"name": "blocked_terms", "terms": []}, "at `$.terms`"),
        ({"name": "blocked_terms", "terms": ["x"], "massage": "typo"}, "unknown field `massage`"),
        ({"name": "pii", "kinds": ["dna"]}, "Invalid enum value 'dna'"),
        ({"name": "max_input_size", "max_chars": 0}, "Expected `int` >= 1"),
        ({"name": "max_input_size", "max_chars": 9, "message": "{huge}"}, "allowed: limit, size"),
    ],
)
def test_a_misconfigured_guardrail_is_a_config_error(
    table: dict[str, object], complaint: str
) -> None:
    with pytest.raises(GatewayConfigError, match="guardrail") as raised:
        build_guardrails([table])

    assert complaint in str(raised.value)


def test_a_new_guardrail_is_a_small_registered_class() -> None:
    @guardrail
    class NoShouting(Guardrail, frozen=True, tag="test_no_shouting"):
        limit: int = 3

        def check(self, inputs: list[ChatMessage]) -> Refusal | None:  # type: ignore[override]
            loud = [m.text for m in inputs if m.text.isupper() and len(m.text) > self.limit]
            return self.refuse("Please don't shout.", "all caps") if loud else None

    try:
        [built] = build_guardrails([{"name": "test_no_shouting", "limit": 2}])
        assert built.check(said("HELLO")) == Refusal(
            text="Please don't shout.", guardrail="test_no_shouting", reason="all caps"
        )
        with pytest.raises(TypeError, match="registered twice"):
            guardrail(NoShouting)
    finally:
        GUARDRAILS.types.pop("test_no_shouting")


def answer(*contents: TextContent | ReasoningContent) -> ChatMessage:
    return ChatMessage(role="assistant", contents=list(contents), message_id="r:m1")


def test_a_disclaimer_is_appended_once_and_reported_as_the_text_to_stream() -> None:
    rewriters = build_rewriters([{"name": "disclaimer", "text": "Prices may change."}])

    rewritten, added = rewrite_final(answer(TextContent(text="QF401 is A$199.")), rewriters)
    again, added_again = rewrite_final(rewritten, rewriters)

    assert rewritten.text == "QF401 is A$199.\n\nPrices may change."
    assert added == "\n\nPrices may change."
    assert rewritten.message_id == "r:m1"
    assert again is rewritten
    assert added_again == ""


def test_a_rewriter_that_changes_streamed_text_says_so() -> None:
    class Upper(Rewriter, frozen=True, tag="test_upper"):
        def rewrite(self, text: str) -> str:
            return text.upper()

    thinking = ReasoningContent(text="hmm")
    rewritten, added = rewrite_final(answer(TextContent(text="hi"), thinking), [Upper()])

    assert rewritten.text == "HI"
    assert thinking in rewritten.contents
    assert added is None


def test_an_unknown_rewriter_is_a_config_error() -> None:
    with pytest.raises(GatewayConfigError, match="unknown output rewriter 'footer'"):
        build_rewriters([{"name": "footer"}])


def test_an_internal_exception_never_reaches_the_user_verbatim() -> None:
    info = user_error(KeyError("password=hunter2 in /srv/secrets.toml"))

    assert info.code == "internal"
    assert info.message == "Something went wrong on our side. Please try again."
    assert "hunter2" not in msgspec.json.encode(info).decode()


def test_errors_written_for_the_caller_keep_their_message_others_get_the_mapped_one() -> None:
    mapping = ErrorMessages(messages={"model_error": "The assistant is busy; try again soon."})

    bad = user_error(BadRequest("input[0].role is 'system'", details={"field": "role"}), mapping)
    model = user_error(ModelError("upstream 500 from https://internal:8443"), mapping)
    remote = user_error(RemoteError("unavailable", "no replica of tool_executor"), mapping)
    down = user_error(Unavailable("nats://10.0.0.7:4222 is down"), mapping)

    assert (bad.code, bad.message, bad.details) == (
        "bad_request",
        "input[0].role is 'system'",
        {"field": "role"},
    )
    assert (model.code, model.message) == ("model_error", "The assistant is busy; try again soon.")
    assert (remote.code, remote.message) == ("unavailable", ErrorMessages().default)
    assert "10.0.0.7" not in down.message
