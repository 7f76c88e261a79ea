"""The one `main` every service process runs: settings → logging → tracing → connect →
service → wait for SIGTERM → drain."""

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Final, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import structlog
import uvloop
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from . import busauth, subjects
from .errors import RunbusError, Unavailable
from .logs import configure_logging
from .progress import Progress, current, install
from .service import Service
from .settings import Settings, SettingsError, load_settings
from .telemetry import setup_tracing

T = TypeVar("T")

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
STOP_TIMEOUT = 25.0
"""Seconds a stopping service gets before its connection is closed under it (the gateway
lets runs finish for 10 s of that; Kubernetes' default grace period is 30 s)."""
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


def redact_url(url: str) -> str:
    """`url` (one or a comma-separated list) with any password or token replaced by `***`:
    what a command may print."""
    redacted = []
    for part in url.split(","):
        parsed = urlsplit(part.strip())
        if parsed.username is None and parsed.password is None:
            redacted.append(part.strip())
            continue
        host = parsed.hostname or ""
        if parsed.port is not None:
            host = f"{host}:{parsed.port}"
        # A lone `user` in a NATS URL is a token: hide it as well.
        who = f"{parsed.username}:***" if parsed.password is not None else "***"
        redacted.append(urlunsplit(parsed._replace(netloc=f"{who}@{host}")))
    return ",".join(redacted)


def process_credentials(settings: Settings, user: str) -> busauth.Credentials | None:
    """RUNBUS_NATS_USER with its password file, else the credentials of `user` that
    `runbus up` generated under the data dir, else none (an open bus)."""
    if settings.nats_user:
        if not settings.nats_password_file:
            raise SettingsError("RUNBUS_NATS_PASSWORD_FILE", "required with RUNBUS_NATS_USER")
        try:
            password = Path(settings.nats_password_file).read_text().strip()
        except OSError as exc:
            raise SettingsError("RUNBUS_NATS_PASSWORD_FILE", str(exc)) from None
        return busauth.Credentials(settings.nats_user, password)
    return busauth.stack_credentials(settings.data_path, user)


PING_INTERVAL: Final = 5
"""Seconds between the pings a connection sends the server it is on."""
MAX_OUTSTANDING_PINGS: Final = 3
"""Unanswered pings after which the connection counts as dead and reconnects elsewhere."""


async def connect(
    url: str,
    name: str,
    *,
    patience: float | None = None,
    credentials: busauth.Credentials | None = None,
) -> NATS:
    """Connect for good: reconnect forever. `url` may list every node of a cluster,
    comma-separated (`nats://n1:4222,nats://n2:4222`).

    A service waits for NATS as long as it takes; a command passes `patience` (seconds) and
    gets `Unavailable` if no server answers by then, rather than hanging.
    """
    servers = [part.strip() for part in url.split(",") if part.strip()]
    log = structlog.get_logger().bind(connection=name)

    # nats-py prints every connection error with a traceback by default; these go to the
    # structured log instead, one line each, so a NATS restart reads as three events.
    async def on_error(exc: Exception) -> None:
        if patience is None:
            log.warning("nats_error", error=repr(exc))

    # A command (patience set) stays quiet: its output may be what a script parses.
    async def on_disconnected() -> None:
        if patience is None:
            log.warning("nats_disconnected")

    async def on_reconnected() -> None:
        if patience is None:
            log.info("nats_reconnected")

    auth = (
        {"user": credentials.user, "password": credentials.password}
        if credentials and not busauth.in_url(url)
        else {}
    )
    connecting = nats.connect(
        servers,
        name=name,
        inbox_prefix=subjects.SERVICE_INBOX_PREFIX,
        **auth,
        # A service reconnects forever; a command gives up after about `patience` seconds
        # without NATS and says so, instead of hanging.
        max_reconnect_attempts=-1 if patience is None else max(1, int(patience / 0.5)),
        reconnect_time_wait=0.5,
        connect_timeout=5,
        # A node cut off or paused keeps the TCP connection open: only missed pings tell. At
        # nats-py's default (two missed pings 120 s apart) a service sat for minutes on a dead
        # node while the rest of the cluster went on; this notices within about 20 s.
        ping_interval=PING_INTERVAL,
        max_outstanding_pings=MAX_OUTSTANDING_PINGS,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
    )
    try:
        nc = await asyncio.wait_for(connecting, timeout=patience)
    except TimeoutError:
        raise Unavailable(
            f"no NATS server answered at {redact_url(url)} within {patience:g} s "
            "(start one with `runbus up`, or set RUNBUS_NATS_URL)"
        ) from None
    return nc


async def serve(factory: ServiceFactory, settings: Settings) -> None:
    log = structlog.get_logger().bind(service=factory.name)
    provider = setup_tracing(factory.name)
    progress = Progress(factory.name)
    install(progress)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        progress.report("connecting to NATS")
        user = busauth.AUTH_USER if factory.name == "auth" else busauth.SERVICE_USER
        # A stop asked for while NATS is not there yet ends the wait, not ignored by it.
        nc = await _unless_stopped(
            connect(
                resolve_nats_url(settings),
                f"runbus-{factory.name}",
                credentials=process_credentials(settings, user),
            ),
            stop,
        )
        if nc is None:
            log.info("service_start_abandoned", step=progress.step)
            return
        progress.attach(nc)
        progress.report("starting")
        service = factory.from_settings(nc, settings, provider)
        # A stop asked for while a dependency is still down ends the start, not waits on it.
        if not await _started(service, stop):
            log.info("service_start_abandoned", step=progress.step)
            await _close_quietly(nc)
            return
        progress.ready()
        # Everything made so far lives as long as the process: the collector need not walk
        # it again on every full collection.
        gc.freeze()
        await stop.wait()
        progress.stopping()
        log.info("service_stopping")
        # The stop is bounded: a second signal or STOP_TIMEOUT cuts it short, so an
        # orchestrator's SIGTERM ends the process even while NATS is unreachable.
        stop.clear()
        stopping = asyncio.ensure_future(_shut_down(service, nc))
        signalled = asyncio.ensure_future(stop.wait())
        await asyncio.wait(
            {stopping, signalled}, timeout=STOP_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        signalled.cancel()
        if not stopping.done():
            log.warning("service_stop_cut_short", timeout=STOP_TIMEOUT)
            stopping.cancel()
            await nc.close()
        elif stopping.exception() is not None:
            log.error("service_stop_failed", error=repr(stopping.exception()))
    finally:
        provider.shutdown()


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None if `stop` was set first (`work` is then cancelled)."""
    working = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({working, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if working.done():
        return working.result()  # a failure raises here
    # Cancelled until it ends: nats-py's connect loop can lose one cancellation (Python
    # 3.11's `wait_for` swallows it when the inner call finished at that moment).
    while not working.done():
        working.cancel()
        await asyncio.wait({working}, timeout=0.1)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        working.result()
    return None


async def _started(service: Service, stop: asyncio.Event) -> bool:
    """Start `service`; False if `stop` was set first (the start is cancelled and what it
    had opened is closed)."""
    if await _unless_stopped(_start(service), stop):
        return True
    with contextlib.suppress(Exception):
        await service.stop()
    return False


async def _start(service: Service) -> bool:
    await service.start()
    return True


async def _close_quietly(nc: NATS) -> None:
    with contextlib.suppress(RuntimeError, OSError, nats.errors.Error):
        await nc.close()


async def _shut_down(service: Service, nc: NATS) -> None:
    """Let the service finish what it holds, then drain the connection if there is one to
    drain (a drain while reconnecting fails at once; closing loses nothing unacked)."""
    await service.stop()
    if nc.is_connected:
        await nc.drain()
    else:
        # nats-py may fail closing a transport the server already closed; nothing is lost.
        with contextlib.suppress(RuntimeError, OSError):
            await nc.close()


def run_service(factory: ServiceFactory) -> None:
    """Entry point of `python -m runbus_<service>`."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"runbus {factory.name}: bad setting {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    json_logs = {"auto": None, "json": True, "console": False}[settings.log_format]
    configure_logging(settings.log_level, json=json_logs)
    try:
        uvloop.run(serve(factory, settings))
    except Exception as exc:
        # One line a supervisor can show, naming what failed and the step it failed in.
        structlog.get_logger().error(
            "service_start_failed",
            service=factory.name,
            step=current().step,
            error=str(exc) or type(exc).__name__,
            error_type=type(exc).__name__,
            exc_info=not isinstance(exc, RunbusError),
        )
        raise SystemExit(1) from None
