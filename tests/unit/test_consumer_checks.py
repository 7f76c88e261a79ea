"""Which client consumer creations the auth service forwards to JetStream: only one that
delivers into an inbox of the user whose events it filters."""

import json

import pytest

from runbus import subjects
from runbus.tokens import TokenVerifier, token_digest
from runbus_auth.consumers import forwarded, refusal

VERIFIER = TokenVerifier.from_file()
ALICE_EVENTS = subjects.events("acme", "alice", "r-1")
CREATE = subjects.CONSUMER_CHECKS.replace("*", "c-1").replace(">", ALICE_EVENTS)


def inbox(token: str) -> str:
    return subjects.client_inbox_prefix(token_digest(token))


def body(deliver: str | None) -> bytes:
    config = {"name": "c-1", "filter_subject": ALICE_EVENTS}
    if deliver is not None:
        config["deliver_subject"] = deliver
    return json.dumps({"stream_name": subjects.EVENTS_STREAM, "config": config}).encode()


def test_a_consumer_delivering_into_an_inbox_of_the_filtered_user_is_forwarded() -> None:
    assert refusal(CREATE, body(f"{inbox('dev-alice')}.abc"), VERIFIER.holder) is None
    assert forwarded(CREATE) == subjects.consumer_create(
        subjects.EVENTS_STREAM, ALICE_EVENTS, subjects.CLIENT_JS_API
    ).replace("*", "c-1")


@pytest.mark.parametrize(
    "deliver",
    [
        None,
        "",
        f"{inbox('dev-bob')}.abc",  # another user of the tenant
        f"{inbox('dev-carol')}.abc",  # another tenant
        f"{inbox('no-such-token')}.abc",
        f"{inbox('dev-alice')}.*",
        f"{inbox('dev-alice')}.>",
        inbox("dev-alice"),
        f"{inbox('dev-alice')}..x",
        subjects.run_cancel("acme", "alice", "r-1"),
        subjects.runs("travel"),
        f"{subjects.SERVICE_INBOX_PREFIX}.x",
    ],
)
def test_any_other_deliver_subject_is_refused(deliver: str | None) -> None:
    assert refusal(CREATE, body(deliver), VERIFIER.holder) is not None


@pytest.mark.parametrize(
    "data", [b"", b"not json", b"[" * 100_000, b'{"config": {"deliver_subject": 7}}']
)
def test_a_body_that_does_not_decode_is_refused_not_raised(data: bytes) -> None:
    assert refusal(CREATE, data, VERIFIER.holder) is not None


@pytest.mark.parametrize(
    "subject",
    [
        subjects.CONSUMER_CHECKS.replace("*", "c-1").replace(">", "runbus.runs.travel"),
        subjects.CONSUMER_CHECKS.replace("RUNBUS_EVENTS", "KV_RUNBUS_RUN_STATE")
        .replace("*", "c-1")
        .replace(">", ALICE_EVENTS),
        subjects.CONSUMER_CHECKS.replace("*", "c-1").replace(">", "runbus.events.acme"),
    ],
)
def test_a_creation_that_is_not_of_one_user_s_events_is_refused(subject: str) -> None:
    assert refusal(subject, body(f"{inbox('dev-alice')}.abc"), VERIFIER.holder) is not None
