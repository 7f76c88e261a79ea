"""A provider's refusal, from its real HTTP status, headers and body, → the router's typed
failure: retried, moved on from, or the request's own fault; a prompt longer than the model's
context is its own error, with a message that tells the run's owner what to change."""

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from runbus.errors import RemoteError
from runbus_gateway.harness.user_errors import user_error
from runbus_model_router.errors import (
    ContextTooLong,
    ProviderRejected,
    ProviderUnavailable,
    TargetMisconfigured,
)
from runbus_model_router.provider_errors import (
    classify_status,
    classify_stream_error,
    retry_after,
)

LLAMACPP = {
    "error": {
        "code": 400,
        "message": "request (1231 tokens) exceeds the available context size (256 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 1231,
        "n_ctx": 256,
    }
}
OPENAI = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 131072 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
VLLM = {
    "object": "error",
    "message": "This model's maximum context length is 2048 tokens. However, you requested "
    "2100 tokens (2050 in the messages, 50 in the completion). Please reduce the length of the "
    "messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
BAD_PARAMETER = {
    "error": {
        "message": "Unrecognized request argument supplied: parallel_tool_calls",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
}


def body(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize(
    ("provider", "refusal", "prompt", "context"),
    [
        ("llama.cpp", LLAMACPP, 1231, 256),
        ("OpenAI", OPENAI, 131072, 128000),
        ("vLLM", VLLM, 2100, 2048),
    ],
)
def test_a_prompt_longer_than_the_context_is_told_apart_with_both_sizes(
    provider: str, refusal: dict[str, Any], prompt: int, context: int
) -> None:
    failure = classify_status(400, {}, body(refusal), model="small-1")

    assert isinstance(failure, ContextTooLong), provider
    assert failure.code == "context_too_long"
    assert (failure.prompt_tokens, failure.context_tokens) == (prompt, context)
    assert failure.details["status"] == 400
    assert f"too long for model 'small-1' ({prompt} tokens; it holds {context})" in failure.message
    for remedy in ("compaction", "last_turns", "larger context"):
        assert remedy in failure.message


def test_a_context_refusal_without_sizes_still_says_what_to_do() -> None:
    refusal = {"error": {"message": "prompt is too long", "type": "invalid_request_error"}}

    failure = classify_status(400, {}, body(refusal), model="m")

    assert isinstance(failure, ContextTooLong)
    assert (failure.prompt_tokens, failure.context_tokens) == (None, None)
    assert failure.message.startswith("the prompt is too long for model 'm'. Send less")


def test_the_run_owner_reads_the_context_message_not_the_generic_one() -> None:
    failure = classify_status(400, {}, body(LLAMACPP), model="smollm2-135m")
    # As the gateway gets it: the router's error reply, code and message kept.
    remote = RemoteError(failure.code, failure.message, details=failure.details)

    shown = user_error(remote)

    assert shown.code == "context_too_long"
    assert shown.message == failure.message
    assert "Something went wrong" not in shown.message


def test_other_refusals_keep_their_class_and_the_providers_message() -> None:
    rejected = classify_status(400, {}, body(BAD_PARAMETER), model="m")
    missing = classify_status(404, {}, body({"error": {"message": "model not found"}}), model="m")
    denied = classify_status(401, {}, b"Unauthorized", model="m")

    assert type(rejected) is ProviderRejected
    assert (
        rejected.reason == "HTTP 400: Unrecognized request argument supplied: parallel_tool_calls"
    )
    assert isinstance(missing, TargetMisconfigured)
    assert missing.reason == "HTTP 404: model not found"
    assert isinstance(denied, TargetMisconfigured)
    assert denied.reason == "HTTP 401: Unauthorized"


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503])
def test_overload_and_server_errors_are_worth_a_retry(status: int) -> None:
    failure = classify_status(status, {}, b"<html>Bad gateway</html>", model="m")

    assert isinstance(failure, ProviderUnavailable)
    assert failure.reason == f"HTTP {status}: <html>Bad gateway</html>"


def test_a_context_message_on_a_server_error_is_still_retried() -> None:
    failure = classify_status(500, {}, body(OPENAI), model="m")

    assert type(failure) is ProviderUnavailable


def test_retry_after_is_read_in_milliseconds_seconds_or_as_a_date() -> None:
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)

    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "2"}) == 2.0
    assert 28 <= (retry_after({"retry-after": soon}) or 0) <= 30
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None
    limited = classify_status(429, {"retry-after": "7"}, body(BAD_PARAMETER), model="m")
    assert isinstance(limited, ProviderUnavailable)
    assert limited.retry_after == 7.0


def test_an_error_event_inside_the_stream_is_retried_unless_it_is_about_the_context() -> None:
    overloaded = classify_stream_error({"message": "overloaded", "type": "server_error"}, model="m")
    too_long = classify_stream_error(OPENAI["error"], model="m")
    bare = classify_stream_error("boom", model="m")

    assert type(overloaded) is ProviderUnavailable
    assert overloaded.reason == "stream error: overloaded"
    assert isinstance(too_long, ContextTooLong)
    assert type(bare) is ProviderUnavailable
    assert bare.reason == "stream error: boom"
