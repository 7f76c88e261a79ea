"""`runbus up`: embedded NATS + the seven services as processes, until Ctrl-C."""

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time

import msgspec

from ..messages.progress import ServiceProgress
from ..settings import Settings
from ..supervisor import SERVICES, STALL_AFTER, ProcessStack, Replica, warm_memory_env
from ._common import Subparsers


def register(subparsers: Subparsers) -> None:
    up = subparsers.add_parser("up", help="embedded NATS + the seven services, logs multiplexed")
    up.add_argument(
        "--replicas",
        action="append",
        default=[],
        metavar="SERVICE=N[,SERVICE=N]",
        help="replicas per service, e.g. tool_executor=3,gateway=2 (repeatable)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="give up if not every service is ready by then (default: wait while they make "
        f"progress; a service silent for {STALL_AFTER:g} s counts as stuck)",
    )
    up.add_argument("--quiet", action="store_true", help="do not echo the services' log lines here")
    up.add_argument(
        "--open-bus",
        action="store_true",
        help="NATS with no authentication at all, for hacking only (warns at every start)",
    )
    up.set_defaults(handler=handle)


def login_hint(settings: Settings) -> str:
    """How to act as a user of this stack (no secret in it: dev tokens are public)."""
    if settings.tokens_file:
        return "log in with RUNBUS_TOKEN=<a token of RUNBUS_TOKENS_FILE>"
    return (
        "dev users: RUNBUS_TOKEN=dev-alice (acme/alice, the default), dev-bob (acme/bob), "
        "dev-carol (globex/carol); e.g. `RUNBUS_TOKEN=dev-bob runbus run hi`"
    )


def parse_replicas(items: list[str]) -> dict[str, int]:
    replicas: dict[str, int] = {}
    for item in (part for value in items for part in value.split(",") if part):
        service, _, count = item.partition("=")
        if service not in SERVICES or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"runbus up: bad --replicas {item!r} (SERVICE=N, N ≥ 1)")
        replicas[service] = int(count)
    return replicas


def say(text: str) -> None:
    print(f"runbus: {text}", file=sys.stderr, flush=True)


def on_progress(replica: Replica, report: ServiceProgress) -> None:
    """One line per step that is worth knowing while the stack comes up."""
    if report.state == "waiting":
        say(
            f"{replica.label} waiting ({report.step}): {report.reason}; retrying "
            f"(try {report.attempt})"
        )
    elif report.state == "degraded":
        say(f"{replica.label} ready but degraded: {report.reason}")
    elif report.state == "ready":
        say(f"{replica.label} ready ({time.monotonic() - replica.spawned_at:.1f} s)")


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    if args.open_bus:
        settings = msgspec.structs.replace(settings, open_bus=True)
    replicas = parse_replicas(args.replicas)
    stack = ProcessStack(
        settings,
        replicas=replicas,
        replica_env=warm_memory_env(os.environ, replicas),
        echo=None if args.quiet else sys.stderr,
        on_progress=on_progress,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP too: the services are out of the terminal's session (see ProcessStack), so a
    # closed terminal must stop them through this process.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    starting = asyncio.ensure_future(stack.start(timeout=args.timeout))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        # Ctrl-C before the stack was ready: the start stops what it had started.
        say("stopping before every service was ready")
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return 130
    stopped.cancel()
    starting.result()  # a failed start raises here; it stopped everything already
    say(
        f"up: NATS at {stack.display_url}; `runbus status` shows the services, "
        "`runbus logs <run>` a run's log lines; Ctrl-C to stop"
    )
    say(login_hint(settings))
    try:
        await stop.wait()
    finally:
        say("draining services")
        await stack.stop()
        say("stopped")
    return 0
