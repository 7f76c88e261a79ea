"""`runbus sessions list|show|export|import|delete` and `runbus history <session>`: the
caller's sessions, through the gateway's authenticated API (as RUNBUS_TOKEN)."""

import argparse
import json
import sys
from pathlib import Path

import msgspec

from .. import ops
from ..client import RunbusClient
from ..messages import ChatMessage, FunctionCallContent, FunctionResultContent, HistoryLoad
from ..messages.sessions import (
    SessionDelete,
    SessionDocument,
    SessionExport,
    SessionGet,
    SessionImport,
    SessionList,
    SessionRecord,
)
from ..settings import Settings
from ._common import Subparsers, connected

_DOCUMENT = msgspec.json.Decoder(SessionDocument)


def register(subparsers: Subparsers) -> None:
    sessions = subparsers.add_parser("sessions", help="your sessions: list, show, export, …")
    actions = sessions.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="your sessions, newest first")
    listing.add_argument("--limit", type=int, default=50)
    for name, text in (
        ("show", "one session's record"),
        ("delete", "delete a session"),
        ("export", "write a session as one JSON document"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("session")
    imported = actions.add_parser("import", help="import a document made by export")
    imported.add_argument("file", help="path, or - for standard input")
    for action in actions.choices.values():
        action.add_argument("--json", action="store_true", help="machine-readable output")
    sessions.set_defaults(handler=handle_sessions)

    history = subparsers.add_parser("history", help="a session's transcript")
    history.add_argument("session")
    history.add_argument("--last-turns", type=int, default=None)
    history.add_argument("--json", action="store_true", help="the messages as JSON")
    history.set_defaults(handler=handle_history)


def _print_json(value: object) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


def _describe(record: SessionRecord) -> str:
    busy = f"  running {record.active_run}" if record.active_run else ""
    return (
        f"{record.session_id:<24} {record.agent:<12} {record.history_length:>5} messages  "
        f"updated {record.updated_at:%Y-%m-%d %H:%M:%S}{busy}"
    )


async def handle_sessions(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        match args.action:
            case "list":
                listed = await client.call(ops.SESSIONS_LIST, SessionList(limit=args.limit))
                if args.json:
                    _print_json(listed.records)
                for record in [] if args.json else listed.records:
                    print(_describe(record))
            case "show":
                info = await client.call(ops.SESSIONS_GET, SessionGet(session_id=args.session))
                if args.json:
                    _print_json(info.record)
                else:
                    print(_describe(info.record))
                    print(json.dumps(info.record.state, indent=2, ensure_ascii=False))
            case "export":
                exported = await client.call(
                    ops.SESSIONS_EXPORT, SessionExport(session_id=args.session)
                )
                _print_json(exported.document)
            case "import":
                raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
                info = await client.call(
                    ops.SESSIONS_IMPORT, SessionImport(document=_DOCUMENT.decode(raw))
                )
                _print_json(info.record) if args.json else print(_describe(info.record))
            case "delete":
                deleted = await client.call(
                    ops.SESSIONS_DELETE, SessionDelete(session_id=args.session)
                )
                _print_json(deleted) if args.json else print(f"deleted {deleted.session_id}")
    return 0


def transcript_line(message: ChatMessage) -> str:
    """One message for a person: role, source, text, tool calls and results."""
    parts = [message.text] if message.text else []
    for part in message.contents:
        if isinstance(part, FunctionCallContent):
            parts.append(f"→ {part.name} {json.dumps(part.arguments, ensure_ascii=False)}")
        elif isinstance(part, FunctionResultContent):
            shown = (
                part.error
                if part.error is not None
                else json.dumps(part.result, ensure_ascii=False)
            )
            parts.append(f"← {shown[:200]}")
    return f"[{message.role:<9}] {' '.join(parts)}"


async def handle_history(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        loaded = await client.call(
            ops.HISTORY_LOAD, HistoryLoad(session_id=args.session, last_turns=args.last_turns)
        )
    if args.json:
        _print_json(loaded.messages)
    for message in [] if args.json else loaded.messages:
        print(transcript_line(message))
    return 0
