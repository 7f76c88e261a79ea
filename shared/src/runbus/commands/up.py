"""`runbus up`: embedded NATS + the six services as processes, until Ctrl-C."""

import argparse
import asyncio
import signal
import sys

from ..settings import Settings
from ..supervisor import SERVICES, ProcessStack
from ._common import Subparsers


def register(subparsers: Subparsers) -> None:
    up = subparsers.add_parser("up", help="embedded NATS + the six services, logs multiplexed")
    up.add_argument(
        "--replicas",
        action="append",
        default=[],
        metavar="SERVICE=N[,SERVICE=N]",
        help="replicas per service, e.g. tool_executor=3,gateway=2 (repeatable)",
    )
    up.set_defaults(handler=handle)


def parse_replicas(items: list[str]) -> dict[str, int]:
    replicas: dict[str, int] = {}
    for item in (part for value in items for part in value.split(",") if part):
        service, _, count = item.partition("=")
        if service not in SERVICES or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"runbus up: bad --replicas {item!r} (SERVICE=N, N ≥ 1)")
        replicas[service] = int(count)
    return replicas


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    stack = ProcessStack(settings, replicas=parse_replicas(args.replicas), echo=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        url = await stack.start()
        print(f"runbus is up: NATS at {url}; Ctrl-C to stop", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        print("runbus: draining services", file=sys.stderr, flush=True)
        await stack.stop()
    return 0
