"""`runbus sessions list|show|export|import|delete` and `runbus history <session>`: the
caller's sessions, through the gateway's authenticated API (as RUNBUS_TOKEN)."""

import argparse
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import msgspec

from .. import ops
from ..client import RunbusClient
from ..messages import ChatMessage, FunctionCallContent, FunctionResultContent, HistoryLoad
from ..messages.sessions import (
    SessionDelete,
    SessionDocument,
    SessionExport,
    SessionExported,
    SessionGet,
    SessionImport,
    SessionList,
    SessionRecord,
    StoredCompaction,
)
from ..render import table
from ..settings import Settings
from ._common import Subparsers, connected

_DOCUMENT = msgspec.json.Decoder(SessionDocument)
_ENCODER = msgspec.json.Encoder()
PART_SHARE = 2
"""An import part's messages take at most 1/PART_SHARE of the bus's max payload."""


def register(subparsers: Subparsers) -> None:
    sessions = subparsers.add_parser("sessions", help="your sessions: list, show, export, …")
    actions = sessions.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="your sessions, newest first")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    for name, text in (
        ("show", "one session's record"),
        ("delete", "delete a session"),
        ("export", "write a session as one JSON document"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("session", help="the session id")
    imported = actions.add_parser("import", help="import a document made by export")
    imported.add_argument("file", help="path, or - for standard input")
    for action in actions.choices.values():
        action.add_argument("--json", action="store_true", help="machine-readable output")
    sessions.set_defaults(handler=handle_sessions)

    history = subparsers.add_parser("history", help="a session's transcript")
    history.add_argument("session", help="the session id")
    history.add_argument(
        "--last-turns", type=int, default=None, help="only the last N turns (default: all)"
    )
    history.add_argument(
        "--originals",
        action="store_true",
        help="every message ever stored, compacted or not (audit), read in pages",
    )
    history.add_argument("--json", action="store_true", help="the messages as JSON")
    history.set_defaults(handler=handle_history)


def _print_json(value: object) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


SESSION_COLUMNS = ("SESSION", "AGENT", "MESSAGES", "UPDATED", "RUNNING")


def _row(record: SessionRecord) -> list[str]:
    return [
        record.session_id,
        record.agent,
        str(record.history_length),
        f"{record.updated_at:%Y-%m-%d %H:%M:%S}",
        record.active_run or "",
    ]


def _describe(record: SessionRecord) -> str:
    return table(SESSION_COLUMNS, [_row(record)])


async def handle_sessions(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        match args.action:
            case "list":
                listed = await client.call(ops.SESSIONS_LIST, SessionList(limit=args.limit))
                if args.json:
                    _print_json(listed.records)
                else:
                    print(table(SESSION_COLUMNS, map(_row, listed.records)))
                if listed.more and not args.json:
                    print("(more sessions did not fit in one reply: ask with a smaller --limit)")
            case "show":
                info = await client.call(ops.SESSIONS_GET, SessionGet(session_id=args.session))
                if args.json:
                    _print_json(info.record)
                else:
                    print(_describe(info.record))
                    print(json.dumps(info.record.state, indent=2, ensure_ascii=False))
            case "export":
                await write_document(export_pages(client, args.session), sys.stdout.buffer)
                sys.stdout.buffer.write(b"\n")
                sys.stdout.flush()
            case "import":
                raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
                record = await import_parts(client, _DOCUMENT.decode(raw), nc.max_payload)
                _print_json(record) if args.json else print(_describe(record))
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


async def export_pages(client: RunbusClient, session_id: str) -> AsyncIterator[SessionExported]:
    """A session's export, page by page (each reply fits on the bus, however long the
    session); each page's compactions are placed among its own messages."""
    after = 0
    while True:
        page = await client.call(
            ops.SESSIONS_EXPORT, SessionExport(session_id=session_id, after=after)
        )
        yield page
        if page.next_after is None:
            return
        after = page.next_after


async def write_document(pages: AsyncIterator[SessionExported], out: IO[bytes]) -> None:
    """One session document written from export pages as they come: messages straight out,
    compactions (placed by the messages before them in the whole document) spooled to a
    temporary file until the messages are written. Memory holds one page."""
    written = 0
    started = False
    abandoned: list[str] = []
    with tempfile.TemporaryFile() as spool:
        async for page in pages:
            document = page.document
            abandoned.extend(document.abandoned_runs)
            if not started:
                started = True
                record = _ENCODER.encode(document.record)
                out.write(b'{"format":"runbus.session.v1","record":' + record + b',"messages":[')
            for message in document.messages:
                out.write((b"," if written else b"") + _ENCODER.encode(message))
                written += 1
            for compaction in document.compactions:
                moved = msgspec.structs.replace(
                    compaction, after=written - len(document.messages) + compaction.after
                )
                spool.write(_ENCODER.encode(moved) + b"\n")
        out.write(b'],"compactions":[')
        spool.seek(0)
        for index, line in enumerate(spool):
            out.write((b"," if index else b"") + line.rstrip(b"\n"))
        out.write(b'],"abandoned_runs":' + _ENCODER.encode(abandoned) + b"}")


def document_parts(document: SessionDocument, part_bytes: int) -> list[SessionDocument]:
    """`document` in parts an import sends one at a time: consecutive messages of at most
    `part_bytes` encoded bytes each (a larger message alone), every compaction in the part
    whose messages it follows, placed by that part's own messages."""
    bounds: list[tuple[int, int]] = []
    start, size = 0, 0
    for index, message in enumerate(document.messages):
        length = len(_ENCODER.encode(message))
        if index > start and size + length > part_bytes:
            bounds.append((start, index))
            start, size = index, 0
        size += length
    bounds.append((start, len(document.messages)))
    placed: list[list[StoredCompaction]] = [[] for _ in bounds]
    for compaction in document.compactions:
        number = next(
            (n for n, (_, end) in enumerate(bounds) if compaction.after <= end), len(bounds) - 1
        )
        begin = bounds[number][0]
        placed[number].append(
            msgspec.structs.replace(compaction, after=max(compaction.after - begin, 0))
        )
    last = len(bounds) - 1
    return [
        msgspec.structs.replace(
            document,
            messages=document.messages[begin:end],
            compactions=placed[number],
            abandoned_runs=document.abandoned_runs if number == last else [],
        )
        for number, (begin, end) in enumerate(bounds)
    ]


async def import_parts(
    client: RunbusClient, document: SessionDocument, max_payload: int
) -> SessionRecord:
    """Import `document` in parts that each fit on the bus: the first creates the session
    (held by the import until the last part), the others name it by its incarnation."""
    parts = document_parts(document, max_payload // (2 * PART_SHARE))
    part_of = ""
    record: SessionRecord | None = None
    for index, part in enumerate(parts):
        info = await client.call(
            ops.SESSIONS_IMPORT,
            SessionImport(document=part, more=index < len(parts) - 1, part_of=part_of),
        )
        record = info.record
        part_of = record.incarnation
    assert record is not None, "a document makes at least one part"
    return record


async def history_pages(
    client: RunbusClient, session_id: str, *, originals: bool
) -> AsyncIterator[list[ChatMessage]]:
    """A session's stored history page by page (each reply fits on the bus)."""
    after = 0
    while True:
        page = await client.call(
            ops.HISTORY_LOAD, HistoryLoad(session_id=session_id, originals=originals, after=after)
        )
        yield page.messages
        if page.next_after is None:
            return
        after = page.next_after


async def handle_history(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        if args.originals:
            first = True
            if args.json:
                sys.stdout.write("[")
            async for messages in history_pages(client, args.session, originals=True):
                for message in messages:
                    if args.json:
                        sys.stdout.write(("" if first else ",") + _ENCODER.encode(message).decode())
                    else:
                        print(transcript_line(message))
                    first = False
            if args.json:
                sys.stdout.write("]\n")
            return 0
        loaded = await client.call(
            ops.HISTORY_LOAD, HistoryLoad(session_id=args.session, last_turns=args.last_turns)
        )
    if args.json:
        _print_json(loaded.messages)
    for message in [] if args.json else loaded.messages:
        print(transcript_line(message))
    return 0
