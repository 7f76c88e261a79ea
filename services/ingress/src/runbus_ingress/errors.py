"""runbus error codes as HTTP answers: one status table, runbus's JSON error body, and OpenAI's
error shape for the OpenAI-compatible routes."""

from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
import structlog
from aiohttp import web

from runbus.errors import RunbusError
from runbus.messages import ErrorCode, ErrorInfo, ErrorReply, encode
from runbus.messages.errors import known_code

log = structlog.get_logger()

STATUS_BY_CODE: Final[dict[ErrorCode, int]] = {
    "bad_request": 400,
    "context_too_long": 400,  # as OpenAI answers a prompt longer than the model's context
    "unsupported_request": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "unknown_agent": 404,
    "conflict": 409,
    "session_busy": 409,
    "message_too_large": 413,
    "cancelled": 409,
    "budget_exceeded": 429,
    "output_blocked": 422,  # an output guardrail withheld the answer
    "model_error": 502,
    "output_invalid": 502,  # the model gave no answer of the asked shape, after a repair turn
    "unavailable": 503,
    "model_unavailable": 503,
    "deadline_exceeded": 504,
}
"""HTTP status of a runbus error code; any other code is a 500."""


def status_of(code: str) -> int:
    """The HTTP status of error code `code` (500 for one not in `STATUS_BY_CODE`)."""
    known = known_code(code)
    return 500 if known is None else STATUS_BY_CODE.get(known, 500)


# aiohttp's own refusals (no route, wrong method, body too large) answered in the same shape.
_CODE_BY_STATUS: Final[dict[int, ErrorCode]] = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
}

OPENAI_PATHS: Final = ("/v1/chat/", "/v1/models", "/v1/responses")
"""Routes whose errors take OpenAI's shape, so OpenAI clients raise their own typed errors."""

_OPENAI_TYPE_BY_STATUS: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIError(msgspec.Struct, frozen=True):
    message: str
    type: str
    """OpenAI's error class (`invalid_request_error`, `not_found_error`, …)."""
    code: str
    """runbus's error code (`unknown_agent`, `session_busy`, …)."""
    param: str | None = None


class OpenAIErrorBody(msgspec.Struct, frozen=True):
    error: OpenAIError


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    info: ErrorInfo,
    *,
    status: int | None = None,
    headers: dict[str, str] | None = None,
    openai: bool = False,
) -> web.Response:
    """`{"type": "error", "error": {code, message, details}}`, the body of a bus error reply;
    with `openai`, `{"error": {message, type, code, param}}` as OpenAI's API answers."""
    status = status or status_of(info.code)
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    body = (
        msgspec.json.encode(OpenAIErrorBody(openai_error(info, status)))
        if openai
        else encode(ErrorReply(error=info))
    )
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def openai_error(info: ErrorInfo, status: int) -> OpenAIError:
    kind = _OPENAI_TYPE_BY_STATUS.get(status, "server_error")
    return OpenAIError(message=info.message, type=kind, code=info.code)


def is_openai(request: web.Request) -> bool:
    return request.path.startswith(OPENAI_PATHS)


@web.middleware
async def typed_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A handler raises runbus errors; the client gets the status and the typed JSON body."""
    openai = is_openai(request)
    try:
        return await handler(request)
    except RunbusError as exc:
        return error_response(exc.to_info(), openai=openai)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODE_BY_STATUS.get(exc.status, "bad_request")
        info = ErrorInfo(code=code, message=exc.reason)
        return error_response(info, status=exc.status, openai=openai)
    except Exception:
        log.exception("http_request_failed", path=request.path)
        info = ErrorInfo(code="internal", message="internal error")
        return error_response(info, openai=openai)
