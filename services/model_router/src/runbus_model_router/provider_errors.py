"""An OpenAI-compatible provider's refusal → the router's typed failures, from the HTTP status,
the headers and the JSON error body; no I/O, so each rule is tested on real providers' bodies.

429, 5xx, 408 and 409 are worth retrying (after `Retry-After` when sent), except a 429 whose
body says no wait will help (an account out of quota, a request larger than the per-minute
limit on its own) and a server that does not implement the call (501, 505): those, and 401,
403 and 404, say this target cannot take the request (another may); any other refusal is the
request's own fault. A prompt longer than the model's context is told apart from the other
refusals, because its remedy is the agent's, not the provider's.
"""

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Final

import msgspec

from .errors import (
    ContextTooLong,
    ProviderFailure,
    ProviderRejected,
    ProviderUnavailable,
    TargetMisconfigured,
)

MAX_REASON: Final = 500
"""Characters of a body that is not an OpenAI error object kept in the reason."""

CONTEXT_CODES: Final = frozenset({"context_length_exceeded", "exceed_context_size_error"})
"""`error.code` / `error.type` of OpenAI and Azure OpenAI, and of the llama.cpp server."""
CONTEXT_MESSAGE: Final = re.compile(
    r"maximum context length|context length exceeded|context_length_exceeded"
    r"|exceeds? the (?:available )?context (?:size|window|length)"
    r"|(?:prompt|input) is too long|longer than the (?:model's )?context",
    re.IGNORECASE,
)
"""The same refusal in words, from servers that send no code (vLLM, LM Studio, proxies)."""
UNFIXABLE_CODES: Final = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "access_terminated"}
)
"""`error.code` / `error.type` of a 429 that no wait fixes: the account itself is refused."""
UNFIXABLE_MESSAGE: Final = re.compile(
    r"exceeded your current quota|request too large for|billing", re.IGNORECASE
)
"""The same in words: OpenAI's quota refusal, and a request over the per-minute token limit
on its own ("Request too large for gpt-4o … on tokens per min")."""
UNIMPLEMENTED: Final = frozenset({501, 505})
"""5xx that no retry fixes: the server does not do what was asked."""
_CONTEXT_SIZE: Final = re.compile(
    r"maximum context length is (\d+)|context size \((\d+) tokens\)", re.IGNORECASE
)
_PROMPT_SIZE: Final = re.compile(
    r"(?:resulted in|you requested|request \() ?(\d+) tokens", re.IGNORECASE
)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if sent."""
    if raw := headers.get("retry-after-ms"):
        try:
            return max(0.0, float(raw) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def error_object(body: bytes) -> dict[str, Any] | None:
    """The `error` object of an OpenAI-style error body (or the body itself when it is one)."""
    try:
        decoded = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if isinstance(decoded, dict):
        inner = decoded.get("error", decoded)
        if isinstance(inner, dict):
            return inner
        if isinstance(inner, str):
            return {"message": inner}
    return None


def describe(error: dict[str, Any] | None, body: bytes) -> str:
    if error is not None and isinstance(message := error.get("message"), str) and message:
        return message
    text = body.decode("utf-8", "replace").strip()
    return text[:MAX_REASON] or "no error message"


def classify_status(
    status: int, headers: Mapping[str, str], body: bytes, *, model: str
) -> ProviderFailure:
    """The failure an HTTP error response stands for."""
    error = error_object(body)
    reason = f"HTTP {status}: {describe(error, body)}"
    if status in (401, 403, 404) or status in UNIMPLEMENTED or (status == 429 and unfixable(error)):
        return TargetMisconfigured(reason, status=status)
    if status == 429 or status >= 500 or status in (408, 409):
        return ProviderUnavailable(reason, status=status, retry_after=retry_after(headers))
    if (overflow := context_overflow(error, model=model, status=status)) is not None:
        return overflow
    return ProviderRejected(reason, status=status)


def unfixable(error: dict[str, Any] | None) -> bool:
    """Whether an error body says no wait or retry makes this target take the request."""
    if error is None:
        return False
    codes = {v for v in (error.get("code"), error.get("type")) if isinstance(v, str)}
    message = error.get("message")
    return bool(UNFIXABLE_CODES & codes) or (
        isinstance(message, str) and UNFIXABLE_MESSAGE.search(message) is not None
    )


def classify_stream_error(error: object, *, model: str) -> ProviderFailure:
    """The failure an error event inside a stream stands for: worth retrying, unless it says
    the prompt does not fit."""
    inner = error if isinstance(error, dict) else {"message": str(error)}
    if (overflow := context_overflow(inner, model=model)) is not None:
        return overflow
    message = inner.get("message")
    return ProviderUnavailable(f"stream error: {message or 'the provider reported an error'}")


def context_overflow(
    error: dict[str, Any] | None, *, model: str, status: int | None = None
) -> ContextTooLong | None:
    """A `ContextTooLong` when the provider's error says the prompt exceeds the context."""
    if error is None:
        return None
    message = error.get("message")
    message = message if isinstance(message, str) else ""
    codes = {v for v in (error.get("code"), error.get("type")) if isinstance(v, str)}
    if not (CONTEXT_CODES & codes or CONTEXT_MESSAGE.search(message)):
        return None
    prompt = _int(error.get("n_prompt_tokens")) or _first_number(_PROMPT_SIZE, message)
    context = _int(error.get("n_ctx")) or _first_number(_CONTEXT_SIZE, message)
    return ContextTooLong(
        model, prompt_tokens=prompt, context_tokens=context, status=status, provider=message
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _first_number(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    if match is None:
        return None
    return next(int(group) for group in match.groups() if group is not None)
