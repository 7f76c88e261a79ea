"""`runbus run`: publish a run request, stream its events, exit 1 if the run fails."""

import argparse
import sys

from ..client import RunbusClient, new_run_id
from ..messages import RunFailed
from ..render import EventPrinter
from ..settings import Settings
from ._common import Subparsers, connected


def register(subparsers: Subparsers) -> None:
    run = subparsers.add_parser("run", help="publish a run request and stream its events")
    run.add_argument("text", help="what the user says")
    run.add_argument("--agent", default="travel")
    run.add_argument("--session", default="s1")
    run.add_argument("--run-id", default=None)
    run.add_argument("--timeout", type=float, default=300.0)
    run.add_argument("--json", action="store_true", help="one JSON event per line")
    run.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    printer = EventPrinter(sys.stdout, as_json=args.json)
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        async for event in client.stream(
            args.agent,
            args.text,
            session_id=args.session,
            run_id=args.run_id or new_run_id(),
            timeout=args.timeout,
        ):
            printer(event)
            if isinstance(event, RunFailed):
                return 1
    return 0
