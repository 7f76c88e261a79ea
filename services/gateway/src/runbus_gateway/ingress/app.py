"""Routes of the HTTP ingress. Each handler makes the same bus calls any client makes, with the
caller's bearer token: the gateway authenticates and authorizes, this process only translates."""

import asyncio
from collections.abc import AsyncGenerator, Iterator
from contextlib import aclosing, contextmanager
from typing import Final

import structlog
from aiohttp import hdrs, web
from nats.aio.client import Client as NATS
from opentelemetry import context as otel_context

from runbus.client import RunbusClient, SequencedEvent, new_run_id
from runbus.errors import BadRequest, Unavailable
from runbus.messages import RunCompleted, RunFailed, encode, is_identifier
from runbus.messages.runs import RUN_INFO_DECODER, RunCancel, RunGet, RunStatus
from runbus.telemetry import extract

from . import sse
from .bodies import bearer_token, decode_start_run
from .errors import error_response, typed_errors

log = structlog.get_logger()

RUN_ID_HEADER: Final = "Runbus-Run-Id"
MAX_BODY: Final = 4 * 1024 * 1024
"""Largest request body; the gateway refuses input text over 256 KiB anyway, the rest is room
for inline images and files (stored as blobs before the run request is published)."""
ENDED: Final[frozenset[RunStatus]] = frozenset({"completed", "failed", "cancelled"})
REPLAY_TIMEOUT: Final = 2.0
"""Seconds to wait for the stored events of a run that has ended: they are all in the stream,
so none arriving means the client has seen them all."""

Events = AsyncGenerator[SequencedEvent, None]
Paced = AsyncGenerator[SequencedEvent | None, None]


class Ingress:
    """The handlers, around one shared NATS connection (a `RunbusClient` per request carries
    that request's token)."""

    def __init__(self, nc: NATS, *, idle_timeout: float, keepalive: float) -> None:
        self.nc = nc
        self.idle_timeout = idle_timeout
        """Seconds a live stream may go without a run event before it is given up."""
        self.keepalive = keepalive
        """Seconds between SSE comments on an idle stream."""

    async def on_start_run(self, request: web.Request) -> web.StreamResponse:
        client = self._client(request)
        start = decode_start_run(await request.read())
        run_id = start.run_id or new_run_id()
        with _caller_trace(request):
            await client.start(
                start.agent, start.message(), session_id=start.session(), run_id=run_id
            )
        log.info("http_run_started", run_id=run_id, agent=start.agent)
        headers = {RUN_ID_HEADER: run_id}
        # The events are read from the stream from its first one, so nothing published before
        # this subscription exists is missed.
        async with aclosing(client.follow(run_id, timeout=self.idle_timeout)) as events:
            if _wants_json(request):
                return await _final(events, headers)
            async with aclosing(sse.with_keepalives(events, self.keepalive)) as paced:
                # The status waits for the first event, or a keepalive's time when the run is
                # queued: a run refused at once (bad token, unknown agent, bad input) is an
                # HTTP error like any other request's, not a stream.
                first = await anext(paced)
                if first is not None and isinstance(first.event, RunFailed):
                    return error_response(first.event.error, headers=headers)
                return await self._stream(request, run_id, first, paced, headers)

    async def on_get_run(self, request: web.Request) -> web.Response:
        info = await self._client(request).call(
            "runs.get", RunGet(run_id=_run_id(request)), RUN_INFO_DECODER
        )
        return _json(encode(info.record))

    async def on_cancel_run(self, request: web.Request) -> web.Response:
        info = await self._client(request).call(
            "runs.cancel", RunCancel(run_id=_run_id(request)), RUN_INFO_DECODER
        )
        # 202: the cancel is on its way to the run; the record shows the status before it.
        return _json(encode(info.record), status=200 if info.record.status in ENDED else 202)

    async def on_run_events(self, request: web.Request) -> web.StreamResponse:
        client = self._client(request)
        run_id = _run_id(request)
        after = _after(request)
        # Events are readable by anyone on the bus who knows the run id; over HTTP only the
        # run's owner may read them (not_found otherwise, as the API answers).
        info = await client.call("runs.get", RunGet(run_id=run_id), RUN_INFO_DECODER)
        ended = info.record.status in ENDED
        timeout = REPLAY_TIMEOUT if ended else self.idle_timeout
        headers = {RUN_ID_HEADER: run_id}
        async with (
            aclosing(client.follow(run_id, after=after, timeout=timeout)) as events,
            aclosing(sse.with_keepalives(events, self.keepalive)) as paced,
        ):
            try:
                first = await anext(paced)
            except Unavailable:
                if not ended:
                    raise
                # 204 tells an EventSource to stop reconnecting: there is nothing left to send.
                return web.Response(status=204, headers=headers)
            return await self._stream(request, run_id, first, paced, headers)

    async def on_healthz(self, request: web.Request) -> web.Response:
        if self.nc.is_connected:
            return _json(b'{"status":"ok"}')
        return _json(b'{"status":"disconnected"}', status=503)

    def _client(self, request: web.Request) -> RunbusClient:
        token = bearer_token(request.headers.get(hdrs.AUTHORIZATION))
        return RunbusClient(self.nc, token=token)

    async def _stream(
        self,
        request: web.Request,
        run_id: str,
        first: SequencedEvent | None,
        paced: Paced,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        """Send `first` and the rest of `paced` as SSE (None: a keepalive) until the run ends."""
        response = web.StreamResponse(
            headers={
                **headers,
                hdrs.CONTENT_TYPE: sse.CONTENT_TYPE,
                hdrs.CACHE_CONTROL: "no-cache",
                "X-Accel-Buffering": "no",  # nginx: pass each event on at once
            }
        )
        await response.prepare(request)
        last_seq = 0
        item = first
        try:
            while True:
                if item is None:
                    await response.write(sse.KEEPALIVE)
                else:
                    await response.write(sse.frame(item.seq, item.event))
                    last_seq = item.seq
                item = await anext(paced)
        except StopAsyncIteration:
            pass  # the final event is sent
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            # The client hung up (or the server is stopping): the run goes on without it, and
            # it can resume with `Last-Event-ID`.
            log.info("http_stream_closed", run_id=run_id, after=last_seq)
            if isinstance(exc, asyncio.CancelledError):
                raise
        except Unavailable as exc:
            # The status line is long gone: end the stream, the client resumes from its last id.
            log.warning("http_stream_idle", run_id=run_id, reason=exc.message)
        except Exception:
            log.exception("http_stream_failed", run_id=run_id, after=last_seq)
        return response


def build_app(
    nc: NATS, *, idle_timeout: float = 330.0, keepalive: float = 15.0, max_body: int = MAX_BODY
) -> web.Application:
    ingress = Ingress(nc, idle_timeout=idle_timeout, keepalive=keepalive)
    app = web.Application(client_max_size=max_body, middlewares=[typed_errors])
    app.add_routes(
        [
            web.post("/v1/runs", ingress.on_start_run),
            web.get("/v1/runs/{run_id}", ingress.on_get_run),
            web.get("/v1/runs/{run_id}/events", ingress.on_run_events),
            web.post("/v1/runs/{run_id}/cancel", ingress.on_cancel_run),
            web.get("/healthz", ingress.on_healthz),
        ]
    )
    return app


async def _final(events: Events, headers: dict[str, str]) -> web.Response:
    """Wait for the end of the run: `run.completed` as JSON, or the run's typed error."""
    final = None
    async for item in events:
        final = item.event
    match final:
        case RunCompleted():
            return _json(encode(final), headers=headers)
        case RunFailed(error=error):
            return error_response(error, headers=headers)
    raise Unavailable("the event stream ended without a final event")


def _run_id(request: web.Request) -> str:
    run_id = request.match_info["run_id"]
    if not is_identifier(run_id):
        raise BadRequest(f"bad run id {run_id!r}: letters, digits, `_` and `-`, at most 128")
    return run_id


def _after(request: web.Request) -> int:
    """Resume point: `Last-Event-ID` (what an EventSource sends when it reconnects) wins over
    `?after=`."""
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    try:
        after = int(raw)
    except ValueError:
        after = -1
    if after < 0:
        raise BadRequest(f"bad event sequence {raw!r}: a stream sequence (an integer >= 0)")
    return after


def _wants_json(request: web.Request) -> bool:
    if request.query.get("wait", "").lower() in ("1", "true"):
        return True
    accept = request.headers.get(hdrs.ACCEPT, "")
    return "application/json" in accept and sse.CONTENT_TYPE not in accept


def _json(body: bytes, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


@contextmanager
def _caller_trace(request: web.Request) -> Iterator[None]:
    """A caller that sends `traceparent` gets the run in its own trace."""
    token = otel_context.attach(extract(request.headers))
    try:
        yield
    finally:
        otel_context.detach(token)
