"""runbus error codes as HTTP answers: one status table and the JSON error body."""

from collections.abc import Awaitable, Callable
from typing import Final

import structlog
from aiohttp import web

from runbus.errors import RunbusError
from runbus.messages import ErrorInfo, ErrorReply, encode

log = structlog.get_logger()

STATUS_BY_CODE: Final[dict[str, int]] = {
    "bad_request": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "unknown_agent": 404,
    "conflict": 409,
    "session_busy": 409,
    "cancelled": 409,
    "budget_exceeded": 429,
    "model_error": 502,
    "unavailable": 503,
    "model_unavailable": 503,
    "deadline_exceeded": 504,
}
"""HTTP status of a runbus error code; any other code is a 500."""

# aiohttp's own refusals (no route, wrong method, body too large) answered in the same shape.
_CODE_BY_STATUS: Final[dict[int, str]] = {
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    info: ErrorInfo, *, status: int | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    """`{"type": "error", "error": {code, message, details}}`, the body of a bus error reply."""
    status = status or STATUS_BY_CODE.get(info.code, 500)
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return web.Response(
        status=status,
        body=encode(ErrorReply(error=info)),
        content_type="application/json",
        headers=headers,
    )


@web.middleware
async def typed_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A handler raises runbus errors; the client gets the status and the typed JSON body."""
    try:
        return await handler(request)
    except RunbusError as exc:
        return error_response(exc.to_info())
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _CODE_BY_STATUS.get(exc.status, "bad_request")
        return error_response(ErrorInfo(code=code, message=exc.reason), status=exc.status)
    except Exception:
        log.exception("http_request_failed", path=request.path)
        return error_response(ErrorInfo(code="internal", message="internal error"))
