"""The ingress process: one HTTP listener and the users' bus connections, closed on SIGTERM."""

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import structlog
from aiohttp import web
from opentelemetry.trace import TracerProvider

from runbus.runner import resolve_nats_url
from runbus.settings import Settings
from runbus.telemetry import setup_tracing

from .app import build_app
from .connections import UserConnections
from .observe import SERVICE_NAME

SHUTDOWN_TIMEOUT = 5.0
"""Seconds open streams get at shutdown; their clients resume elsewhere with Last-Event-ID."""


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
) -> AsyncIterator[str]:
    """Serve the ingress for the bus at `url` on `host:port` (0: any free port) and yield its
    base URL."""
    app = build_app(
        url,
        idle_timeout=idle_timeout,
        keepalive=keepalive,
        jaeger_url=jaeger_url,
        connections=connections,
        tracer_provider=tracer_provider,
    )
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
        url = await stack.enter_async_context(
            listening(
                resolve_nats_url(settings),
                host,
                port,
                idle_timeout=idle_timeout,
                jaeger_url=settings.jaeger_url,
            )
        )
        log.info("http_listening", url=url)
        await stop.wait()
        log.info("service_stopping")
