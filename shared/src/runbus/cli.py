"""The `runbus` command: up, serve, run, demo."""

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import uvloop

from . import __version__
from .client import RunbusClient, new_run_id
from .errors import RunbusError
from .logs import configure_logging
from .messages import RunFailed
from .render import EventPrinter
from .runner import connect, resolve_nats_url
from .settings import Settings, SettingsError, load_settings
from .supervisor import SERVICES, ProcessStack, StackError


async def run_command(settings: Settings, args: argparse.Namespace) -> int:
    nc = await connect(resolve_nats_url(settings), "runbus-cli")
    printer = EventPrinter(sys.stdout, as_json=args.json)
    try:
        client = RunbusClient(nc, token=settings.token)
        async for event in client.run(
            args.agent,
            args.session,
            args.text,
            run_id=args.run_id or new_run_id(),
            timeout=args.timeout,
        ):
            printer(event)
            if isinstance(event, RunFailed):
                return 1
        return 0
    finally:
        await nc.drain()


async def up_command(settings: Settings, args: argparse.Namespace) -> int:
    replicas = {}
    for item in args.replicas:
        service, _, count = item.partition("=")
        replicas[service] = int(count)
    stack = ProcessStack(settings, replicas=replicas, echo=sys.stderr)
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


async def demo_command(settings: Settings, args: argparse.Namespace) -> int:
    from .demo import run_demo

    return await run_demo(settings, sys.stdout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runbus", description=__doc__)
    parser.add_argument("--version", action="version", version=f"runbus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="embedded NATS + the six services, logs multiplexed")
    up.add_argument(
        "--replicas",
        action="append",
        default=[],
        metavar="SERVICE=N",
        help="start N replicas of SERVICE (repeatable)",
    )

    serve = commands.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("service", choices=SERVICES)

    run = commands.add_parser("run", help="publish a run request and stream its events")
    run.add_argument("text", help="what the user says")
    run.add_argument("--agent", default="travel")
    run.add_argument("--session", default="s1")
    run.add_argument("--run-id", default=None)
    run.add_argument("--timeout", type=float, default=300.0)
    run.add_argument("--json", action="store_true", help="one JSON event per line")

    commands.add_parser("demo", help="start the embedded stack, run the demo, stop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"runbus: bad setting {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        os.execv(sys.executable, [sys.executable, "-m", f"runbus_{args.service}"])
    configure_logging(settings.log_level)
    command = {"run": run_command, "up": up_command, "demo": demo_command}[args.command]
    try:
        return uvloop.run(command(settings, args))
    except (RunbusError, StackError) as exc:
        print(f"runbus: {exc}", file=sys.stderr)
        return 1
