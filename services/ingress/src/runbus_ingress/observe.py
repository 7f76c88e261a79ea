"""What the ingress tells about each request: an HTTP server span (OpenTelemetry's HTTP server
conventions) that is the root of a run started by the request, or a child of the caller's
`traceparent`, and one access log line."""

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TextIO

import msgspec
import structlog
from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue
from structlog.typing import EventDict, WrappedLogger

from runbus.telemetry import extract, start_span

from .context import RUN_ID_HEADER

log = structlog.get_logger()

SERVICE_NAME: Final = "http_ingress"
LOG_FILE: Final = f"{SERVICE_NAME}.log"
"""Its name in the data directory's `logs/`, beside the files `runbus up` writes for the
services, so `runbus logs <run>` finds the ingress's lines too."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CLIENT_CLOSED: Final = 499
"""The status logged for a request whose client hung up before the answer ended (nginx's)."""
TRACER_KEY: Final = web.AppKey("tracer", Tracer)


def route_of(request: web.Request) -> str:
    """The matched route's template (`/v1/runs/{run_id}`); "" when no route matched."""
    resource = request.match_info.route.resource
    return "" if resource is None else resource.canonical


def server_attributes(request: web.Request) -> dict[str, AttributeValue]:
    """The request's attributes known before it is handled."""
    url = request.url
    attributes: dict[str, AttributeValue] = {
        "http.request.method": request.method,
        "url.path": request.path,
        "url.scheme": request.scheme,
        "network.protocol.version": f"{request.version.major}.{request.version.minor}",
    }
    if url.host:
        attributes["server.address"] = url.host
    if url.port is not None:
        attributes["server.port"] = url.port
    if route := route_of(request):
        attributes["http.route"] = route
    if agent := request.headers.get("User-Agent"):
        attributes["user_agent.original"] = agent
    if request.remote:
        attributes["client.address"] = request.remote
    return attributes


@web.middleware
async def observed(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The span around the whole request (a stream's too, so a run followed or waited for
    lies inside it), then the access log line."""
    tracer = request.app[TRACER_KEY]
    structlog.contextvars.bind_contextvars(service=SERVICE_NAME)  # this request's task only
    route = route_of(request)
    started = time.perf_counter()
    status = 500
    response: web.StreamResponse | None = None
    # Attributes only on a span that records (as on the bus's hops): without an exporter the
    # span costs next to nothing, and it still carries the trace the run joins.
    span = start_span(
        tracer,
        f"{request.method} {route}" if route else request.method,
        SpanKind.SERVER,
        context=extract(request.headers),
    )
    recording = span.is_recording()
    if recording:
        span.set_attributes(server_attributes(request))
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            run_id = _run_id(request, response)
            if recording:
                span.set_attribute("http.response.status_code", status)
                if run_id:
                    span.set_attribute("runbus.run_id", run_id)
                if status >= 500 and status != CLIENT_CLOSED:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
            log.info(
                "http_request",
                method=request.method,
                route=route or None,
                path=request.path,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 1),
                run_id=run_id,
            )


def _run_id(request: web.Request, response: web.StreamResponse | None) -> str | None:
    named = response.headers.get(RUN_ID_HEADER) if response is not None else None
    return named or request.match_info.get("run_id")


class LogFile:
    """A logging processor that appends each line as JSON to a file and passes it on to the
    terminal's renderer unchanged."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.encoder = msgspec.json.Encoder(enc_hook=str)

    def __call__(self, _: WrappedLogger, __: str, event: EventDict) -> EventDict:
        self.out.write(self.encoder.encode(event).decode() + "\n")
        return event


def log_to_file(logs_dir: Path) -> Path | None:
    """Also write every log line to `logs_dir/http_ingress.log` (after `configure_logging`);
    None, said on stderr, when the file cannot be opened (the terminal still gets the lines)."""
    path = logs_dir / LOG_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = path.open("a", encoding="utf-8", buffering=1)
    except OSError as exc:
        print(f"runbus http: no log file ({exc}); logging to stderr only", file=sys.stderr)
        return None
    processors = list(structlog.get_config()["processors"])
    structlog.configure(processors=[*processors[:-1], LogFile(out), processors[-1]])
    return path
