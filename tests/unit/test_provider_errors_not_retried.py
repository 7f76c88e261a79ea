"""Provider refusals that no wait or retry fixes are not retried on the same target: the
router moves on to the route's next target, and a run fails at once instead of after four
calls."""

from typing import Any

import msgspec
import pytest

from runbus_model_router.errors import ProviderUnavailable, TargetMisconfigured
from runbus_model_router.provider_errors import classify_status

QUOTA = {
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details.",
        "type": "insufficient_quota",
        "param": None,
        "code": "insufficient_quota",
    }
}
TOO_LARGE_FOR_THE_RATE_LIMIT = {
    "error": {
        "message": "Request too large for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 30000, Requested 45000.",
        "type": "tokens",
        "code": "rate_limit_exceeded",
    }
}
RATE_LIMITED = {
    "error": {
        "message": "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500.",
        "type": "requests",
        "code": "rate_limit_exceeded",
    }
}


def body(error: dict[str, Any]) -> bytes:
    return msgspec.json.encode(error)


@pytest.mark.parametrize(
    ("status", "refusal"),
    [
        (429, QUOTA),
        (429, TOO_LARGE_FOR_THE_RATE_LIMIT),
        (501, {"error": {"message": "not implemented"}}),
        (505, {"error": {"message": "HTTP version not supported"}}),
    ],
)
def test_a_refusal_no_wait_fixes_moves_on_instead_of_retrying(
    status: int, refusal: dict[str, Any]
) -> None:
    failure = classify_status(status, {"retry-after": "1"}, body(refusal), model="m")

    assert type(failure) is TargetMisconfigured
    assert failure.details["status"] == status


def test_a_plain_rate_limit_and_a_server_error_are_still_retried() -> None:
    assert type(classify_status(429, {}, body(RATE_LIMITED), model="m")) is ProviderUnavailable
    assert type(classify_status(503, {}, b"overloaded", model="m")) is ProviderUnavailable
