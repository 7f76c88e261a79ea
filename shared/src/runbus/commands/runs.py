"""`runbus runs list|show|cancel|follow|pause|pending|edit|resume|fork`: the caller's runs,
through the gateway's API."""

import argparse
import json
import sys

import msgspec

from .. import ops
from ..client import RunbusClient
from ..messages.runs import (
    CallEdit,
    RunCancel,
    RunEdit,
    RunFork,
    RunGet,
    RunList,
    RunPause,
    RunPending,
    RunPendingGet,
    RunRecord,
    RunResume,
)
from ..render import EventPrinter, table
from ..settings import Settings
from ._common import Subparsers, connected


def register(subparsers: Subparsers) -> None:
    runs = subparsers.add_parser(
        "runs", help="your runs: list, show, cancel, follow, pause, edit, resume, fork"
    )
    actions = runs.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="your runs, newest first")
    listing.add_argument("--session", default=None, help="only this session's runs")
    listing.add_argument("--limit", type=int, default=20, help="at most this many (default 20)")
    listing.add_argument(
        "--parent", default=None, help="only the child runs of this run (agents it called)"
    )
    for name, text in (
        ("show", "one run's status and result"),
        ("cancel", "cancel a run"),
        ("follow", "replay a run's events, then follow it live"),
        ("pause", "pause a run at its next step boundary"),
        ("pending", "what a paused run would do next: its pending calls and messages"),
        ("edit", "change a paused run's pending calls or add a message (it stays paused)"),
        ("resume", "let a paused run go on, as edited"),
        ("fork", "start a new session from one of a run's checkpoints"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("run_id", help="the run id (r-…)")
    actions.choices["follow"].add_argument(
        "--after", type=int, default=0, help="resume after this event sequence"
    )
    edit = actions.choices["edit"]
    edit.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CALL_ID=JSON",
        help="replace a pending call's arguments with this JSON object",
    )
    edit.add_argument(
        "--drop", action="append", default=[], metavar="CALL_ID", help="do not run this call"
    )
    edit.add_argument("--note", action="append", default=[], help="a message the model reads next")
    fork = actions.choices["fork"]
    fork.add_argument("--session", required=True, help="the new session's id")
    fork.add_argument(
        "--checkpoint",
        type=int,
        default=None,
        help="how many of the run's stored messages to keep (default: all)",
    )
    for action in actions.choices.values():
        action.add_argument("--json", action="store_true", help="machine-readable output")
    runs.set_defaults(handler=handle)


RUN_COLUMNS = ("RUN", "STATUS", "AGENT", "SESSION", "CREATED", "RESULT")


def nested(records: list[RunRecord]) -> list[RunRecord]:
    """Each run followed by its child runs (the agents it called), theirs after them; a child
    whose parent is not listed stands on its own. Order within a level is kept."""
    listed = {r.run_id for r in records}
    children: dict[str, list[RunRecord]] = {}
    for record in records:
        if record.parent_run_id in listed:
            children.setdefault(record.parent_run_id, []).append(record)
    ordered: list[RunRecord] = []

    def add(record: RunRecord) -> None:
        ordered.append(record)
        for child in children.get(record.run_id, []):
            add(child)

    for record in records:
        if record.parent_run_id not in listed:
            add(record)
    return ordered


def _row(record: RunRecord, listed: frozenset[str] = frozenset()) -> list[str]:
    outcome = record.text or (
        f"[{record.error.code}] {record.error.message}" if record.error else ""
    )
    # A child run listed with its parent is indented under it.
    indent = "  " * record.depth + "└ " if record.parent_run_id in listed else ""
    return [
        indent + record.run_id,
        record.status,
        record.agent,
        record.session_id,
        f"{record.created_at:%Y-%m-%d %H:%M:%S}",
        outcome[:80],
    ]


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        match args.action:
            case "list":
                listed = await client.call(
                    ops.API_RUNS_LIST,
                    RunList(session_id=args.session, limit=args.limit, parent_run_id=args.parent),
                )
                if args.json:
                    sys.stdout.write(msgspec.json.encode(listed.records).decode() + "\n")
                else:
                    ids = frozenset(r.run_id for r in listed.records)
                    rows = [_row(r, ids) for r in nested(listed.records)]
                    print(table(RUN_COLUMNS, rows))
            case "show" | "cancel":
                if args.action == "show":
                    info = await client.call(ops.API_RUNS_GET, RunGet(run_id=args.run_id))
                else:
                    info = await client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=args.run_id))
                if args.json:
                    sys.stdout.write(msgspec.json.encode(info.record).decode() + "\n")
                else:
                    print(table(RUN_COLUMNS, [_row(info.record)]))
                    if info.record.parent_run_id:
                        print(
                            f"child run of {info.record.parent_run_id} "
                            f"(depth {info.record.depth}, root {info.record.root_run_id})"
                        )
                    if args.action == "cancel" and info.record.status == "running":
                        print("cancel requested")
            case "follow":
                printer = EventPrinter(sys.stdout, as_json=args.json)
                async for item in client.follow(args.run_id, after=args.after):
                    printer(item.event)
            case "pause" | "pending" | "edit" | "resume":
                pending = await _step_in(client, args)
                if args.json:
                    sys.stdout.write(msgspec.json.encode(pending).decode() + "\n")
                else:
                    print(_pending(pending))
            case "fork":
                forked = await client.call(
                    ops.API_RUNS_FORK,
                    RunFork(
                        run_id=args.run_id, session_id=args.session, checkpoint=args.checkpoint
                    ),
                )
                if args.json:
                    sys.stdout.write(msgspec.json.encode(forked).decode() + "\n")
                else:
                    print(
                        f"session {forked.session_id}: {forked.messages} messages, from checkpoint"
                        f" {forked.checkpoint} of {len(forked.checkpoints)} of run {forked.run_id}"
                    )
    return 0


async def _step_in(client: RunbusClient, args: argparse.Namespace) -> RunPending:
    run_id = args.run_id
    match args.action:
        case "pause":
            return await client.call(ops.API_RUNS_PAUSE, RunPause(run_id=run_id))
        case "pending":
            return await client.call(ops.API_RUNS_PENDING, RunPendingGet(run_id=run_id))
        case "resume":
            return await client.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
    replace = []
    for item in args.set:
        call_id, _, arguments = item.partition("=")
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"--set {call_id}=…: not JSON ({exc.msg})") from None
        if not isinstance(value, dict):
            raise SystemExit(f"--set {call_id}=…: the arguments must be a JSON object")
        replace.append(CallEdit(call_id=call_id, arguments=value))
    edit = RunEdit(run_id=run_id, replace=replace, drop=args.drop, add=args.note)
    return await client.call(ops.API_RUNS_EDIT, edit)


def _pending(pending: RunPending) -> str:
    lines = [f"run {pending.run_id}: {pending.status} (after step {pending.step})"]
    for call in pending.calls:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        lines.append(f"  call {call.call_id}: {call.name} {arguments}")
    for message in pending.messages:
        if message.role == "user":
            lines.append(f"  note: {message.text}")
    return "\n".join(lines)
