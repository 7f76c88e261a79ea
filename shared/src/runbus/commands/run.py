"""`runbus run`: publish a run request, stream its events, exit 1 if the run fails."""

import argparse
import asyncio
import contextlib
import sys
import uuid

from ..client import RunbusClient, new_run_id
from ..errors import Unavailable
from ..messages import RunFailed
from ..render import EventPrinter, WaitNotice
from ..settings import Settings
from ._common import Subparsers, connected


def register(subparsers: Subparsers) -> None:
    run = subparsers.add_parser("run", help="publish a run request and stream its events")
    run.add_argument("text", help="what the user says")
    run.add_argument("--agent", default="travel", help="the agent to run (default travel)")
    run.add_argument(
        "--session",
        default=None,
        help="continue this session (default: a new session per run, named in the output)",
    )
    run.add_argument("--run-id", default=None, help="the run's id (default: a new r-… id)")
    run.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for the run's next event (default 300)",
    )
    run.add_argument("--json", action="store_true", help="one JSON event per line")
    run.set_defaults(handler=handle)


def new_session_id() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    run_id = args.run_id or new_run_id()
    session_id = args.session or new_session_id()
    printer = EventPrinter(sys.stdout, as_json=args.json)
    # Progress notes go to stderr: stdout stays the run's own output.
    notice = WaitNotice(sys.stderr)
    async with connected(settings) as nc, contextlib.AsyncExitStack() as background:
        if not args.json:
            # The ids first: `runbus logs`, `runbus runs show` and `--session` need them.
            new = " (new; `--session ID` continues one)" if args.session is None else ""
            print(f"run {run_id} · agent {args.agent} · session {session_id}{new}", flush=True)
            ticking = asyncio.ensure_future(notice.run())
            background.callback(ticking.cancel)
        client = RunbusClient(nc, token=settings.token)
        events = client.stream(
            args.agent,
            args.text,
            session_id=session_id,
            run_id=run_id,
            timeout=args.timeout,
        )
        # Closed before the connection drains: an open event subscription would fail the drain.
        async with contextlib.aclosing(events):
            try:
                async for event in events:
                    notice.saw(event)
                    printer(event)
                    if isinstance(event, RunFailed):
                        return 1
            except Unavailable as exc:
                raise Unavailable(
                    f"{exc}; wait longer with `runbus run --timeout SECONDS` (a run's own "
                    "limit is the gateway's RUNBUS_RUN_TIMEOUT)"
                ) from None
    return 0
