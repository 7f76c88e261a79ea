"""`runbus approve|deny <run_id> <call_id>`: decide a call a run is waiting on."""

import argparse

from .. import ops
from ..client import RunbusClient
from ..messages.runs import ApprovalDecide
from ..settings import Settings
from ._common import Subparsers, connected


def register(subparsers: Subparsers) -> None:
    for verb, decision in (("approve", "approved"), ("deny", "denied")):
        parser = subparsers.add_parser(verb, help=f"{verb} a tool call a run is waiting on")
        parser.add_argument("run_id", help="the run waiting (r-…), as `runbus run` prints it")
        parser.add_argument("call_id", help="the tool call waiting, as `runbus run` prints it")
        parser.add_argument(
            "--note",
            default="",
            help="shown to the model with a denial; the answer, when a tool asks a question",
        )
        parser.set_defaults(handler=handle, decision=decision)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        decided = await client.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(
                run_id=args.run_id, call_id=args.call_id, decision=args.decision, note=args.note
            ),
        )
    print(f"{decided.run_id} {decided.call_id}: {decided.decision}")
    return 0
