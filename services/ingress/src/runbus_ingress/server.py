"""The ingress process: one HTTP listener and the users' bus connections, closed on SIGTERM."""

import asyncio
import contextlib
import errno
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final
from urllib.parse import urlsplit

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry.trace import TracerProvider

from runbus.errors import Unavailable
from runbus.runner import redact_url, resolve_nats_url
from runbus.settings import Settings
from runbus.telemetry import setup_tracing

from .app import build_app
from .connections import UserConnections
from .errors import Handler
from .observe import SERVICE_NAME

SHUTDOWN_TIMEOUT = 5.0
"""Seconds open streams get at shutdown; their clients resume elsewhere with Last-Event-ID."""


PROBE_TIMEOUT: Final = 0.5
"""Seconds a bus address gets to accept a TCP connection before it counts as down."""
PROBE_EVERY: Final = 1.0
"""Seconds a probe's answer is reused: at most one TCP connect per second, however busy."""


class BusProbe:
    """Whether anything listens at the bus's address, checked at most once a second: with no
    stack running, `/healthz` and every API request answer 503 with the reason at once, not
    after nats-py's minute of retries per user."""

    def __init__(self, url: str | list[str]) -> None:
        parts = [url] if isinstance(url, str) else url
        self.servers = [p.strip() for item in parts for p in item.split(",") if p.strip()]
        self._checked = -PROBE_EVERY
        self._up = False

    async def _answers(self, server: str) -> bool:
        address = urlsplit(server if "://" in server else f"nats://{server}")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(address.hostname, address.port or 4222), PROBE_TIMEOUT
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def up(self) -> bool:
        if time.monotonic() - self._checked >= PROBE_EVERY:
            answers = await asyncio.gather(*(self._answers(s) for s in self.servers))
            self._up, self._checked = any(answers), time.monotonic()
        return self._up

    def middleware(self) -> Middleware:
        @web.middleware
        async def bus_reachable(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path.startswith(("/v1/", "/healthz")) and not await self.up():
                raise Unavailable(
                    f"no runbus stack answers at {redact_url(','.join(self.servers))}: start "
                    "one with `runbus up` (or point RUNBUS_NATS_URL at one)"
                )
            return await handler(request)

        return bus_reachable


@asynccontextmanager
async def listening(
    url: str | list[str],
    host: str,
    port: int,
    *,
    idle_timeout: float = 330.0,
    keepalive: float = 15.0,
    jaeger_url: str = "",
    connections: UserConnections | None = None,
    tracer_provider: TracerProvider | None = None,
    probe_bus: bool = False,
) -> AsyncIterator[str]:
    """Serve the ingress for the bus at `url` on `host:port` (0: any free port) and yield its
    base URL. With `probe_bus`, requests are refused (503) while nothing listens at `url`."""
    app = build_app(
        url,
        idle_timeout=idle_timeout,
        keepalive=keepalive,
        jaeger_url=jaeger_url,
        connections=connections,
        tracer_provider=tracer_provider,
    )
    if probe_bus:
        # Innermost, so the error middleware words its refusal and the access log records it.
        app.middlewares.append(BusProbe(url).middleware())
    # A client that hangs up cancels its handler at once: the run lives on the bus, and the
    # subscription that followed it for this client is closed without waiting for an event.
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=SHUTDOWN_TIMEOUT, access_log=None
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()


async def serve(settings: Settings, host: str, port: int) -> None:
    structlog.contextvars.bind_contextvars(service=SERVICE_NAME)
    log = structlog.get_logger()
    provider = setup_tracing(SERVICE_NAME)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        stack.callback(provider.shutdown)
        # A stream stays open as long as a run may take, plus a hop's time for the last event.
        idle_timeout = settings.run_timeout + settings.request_timeout
        try:
            url = await stack.enter_async_context(
                listening(
                    resolve_nats_url(settings),
                    host,
                    port,
                    idle_timeout=idle_timeout,
                    jaeger_url=settings.jaeger_url,
                    probe_bus=True,
                )
            )
        except OSError as exc:  # the port is taken, or the address is not this machine's
            why = (
                f"port {port} is taken (another `runbus http`?); choose one with --port"
                if exc.errno == errno.EADDRINUSE
                else str(exc.strerror or exc)
            )
            raise SystemExit(f"runbus http: cannot listen on {host}:{port}: {why}") from None
        log.info("http_listening", url=url)
        await stop.wait()
        log.info("service_stopping")
