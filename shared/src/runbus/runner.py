"""The one `main` every service process runs: settings → logging → tracing → connect →
service → wait for SIGTERM → drain."""

import asyncio
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Protocol

import nats
import structlog
import uvloop
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from .logs import configure_logging
from .service import Service
from .settings import Settings, SettingsError, load_settings
from .telemetry import setup_tracing

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
URL_FILE = "nats.url"


class ServiceFactory(Protocol):
    name: str

    def from_settings(
        self, nc: NATS, settings: Settings, tracer_provider: TracerProvider
    ) -> Service: ...


def resolve_nats_url(settings: Settings) -> str:
    """RUNBUS_NATS_URL, else the embedded server `runbus up` recorded, else localhost:4222."""
    if settings.nats_url:
        return settings.nats_url
    recorded = Path(settings.data_dir) / URL_FILE
    if recorded.exists():
        return recorded.read_text().strip()
    return DEFAULT_NATS_URL


async def connect(url: str, name: str) -> NATS:
    """Connect for good: reconnect forever. `url` may list every node of a cluster,
    comma-separated (`nats://n1:4222,nats://n2:4222`)."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    return await nats.connect(
        servers, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=5
    )


async def serve(factory: ServiceFactory, settings: Settings) -> None:
    log = structlog.get_logger().bind(service=factory.name)
    provider = setup_tracing(factory.name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        stack.callback(provider.shutdown)
        nc = await connect(resolve_nats_url(settings), f"runbus-{factory.name}")
        stack.push_async_callback(nc.drain)
        service = factory.from_settings(nc, settings, provider)
        await service.start()
        stack.push_async_callback(service.stop)
        await stop.wait()
        log.info("service_stopping")


def run_service(factory: ServiceFactory) -> None:
    """Entry point of `python -m runbus_<service>`."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"runbus {factory.name}: bad setting {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    json_logs = {"auto": None, "json": True, "console": False}[settings.log_format]
    configure_logging(settings.log_level, json=json_logs)
    uvloop.run(serve(factory, settings))
