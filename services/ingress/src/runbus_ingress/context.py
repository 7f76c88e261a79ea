"""What every route shares: the caller's bus client, request parameters and JSON answers."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec
from aiohttp import hdrs, web

from runbus.client import RunbusClient
from runbus.decoding import decode_untrusted
from runbus.errors import BadRequest
from runbus.messages import is_identifier

from .bodies import bearer_token
from .connections import UserConnections

T = TypeVar("T")

RUN_ID_HEADER: Final = "Runbus-Run-Id"
TRACE_ID_HEADER: Final = "Runbus-Trace-Id"


@dataclass(frozen=True)
class Ingress:
    """The state behind the routes: the per-user connections and the stream timings."""

    connections: UserConnections
    idle_timeout: float = 330.0
    """Seconds a live stream may go without a run event before it is given up."""
    keepalive: float = 15.0
    """Seconds between SSE comments on an idle stream."""
    jaeger_url: str = ""
    """Jaeger's base URL (`/trace/<trace_id>` is appended), or a URL with `{trace_id}` in it:
    where the console links a run's trace id."""

    @asynccontextmanager
    async def client(self, request: web.Request) -> AsyncIterator[RunbusClient]:
        """The caller's client (their own bus connection) for as long as the block runs."""
        token = bearer_token(request.headers.get(hdrs.AUTHORIZATION))
        async with self.connections.lease(token) as client:
            yield client


INGRESS_KEY: Final = web.AppKey("ingress", Ingress)


def ingress_of(request: web.Request) -> Ingress:
    return request.app[INGRESS_KEY]


def identifier(request: web.Request, name: str) -> str:
    """A path parameter that must be a runbus identifier (run, session, call id)."""
    return checked_identifier(request.match_info[name], name)


def identifier_query(request: web.Request, name: str) -> str | None:
    """An optional query parameter that, when given, must be a runbus identifier."""
    value = request.query.get(name)
    return None if value is None else checked_identifier(value, name)


def checked_identifier(value: str, name: str) -> str:
    if not is_identifier(value):
        raise BadRequest(f"bad {name} {value!r}: letters, digits, `_` and `-`, at most 128")
    return value


def int_query(request: web.Request, name: str, default: int, *, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadRequest(f"bad {name} {raw!r}: an integer from {low} to {high}")
    return value


def json_response(
    body: object, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """`body` as JSON: bytes go out as they are, anything else through msgspec."""
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return web.Response(status=status, body=data, content_type="application/json", headers=headers)


def decode_body(body: bytes, decoder: "msgspec.json.Decoder[T]", what: str) -> T:
    """A request body, or `bad_request` naming what was wrong with it."""
    return decode_untrusted(decoder, body, f"{what} body")
