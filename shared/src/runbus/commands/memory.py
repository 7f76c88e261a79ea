"""`runbus memory list|search|forget|stats`: the caller's long-term memories, through the
gateway's authenticated API (as RUNBUS_TOKEN); nobody sees or forgets another user's."""

import argparse
import sys

import msgspec

from .. import ops
from ..client import RunbusClient
from ..messages.memory import (
    MemoryForget,
    MemoryHit,
    MemoryList,
    MemorySearch,
    MemoryStats,
)
from ..render import table
from ..settings import Settings
from ._common import Subparsers, connected

PAGE = 200


def register(subparsers: Subparsers) -> None:
    memory = subparsers.add_parser("memory", help="your long-term memories: list, search, forget")
    actions = memory.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="what is remembered about you, newest first")
    listing.add_argument("--session", default=None, help="only what you said in this session")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument(
        "--retired",
        action="store_true",
        help="an audit read: also what a later fact superseded or the model policy deleted",
    )
    search = actions.add_parser("search", help="your memories closest to a text")
    search.add_argument("query", help="what to look for, in your words")
    search.add_argument("--limit", type=int, default=5, help="at most this many (default 5)")
    forget = actions.add_parser("forget", help="forget memories (by id, a session, or all)")
    forget.add_argument("memory_ids", nargs="*", metavar="ID", help="ids shown by `list`")
    forget.add_argument("--session", default=None, help="everything said in this session")
    forget.add_argument("--all", action="store_true", help="everything remembered about you")
    actions.add_parser("stats", help="how many memories you have, and the embedder")
    for action in actions.choices.values():
        action.add_argument("--json", action="store_true", help="machine-readable output")
    memory.set_defaults(handler=handle)


def forget_request(args: argparse.Namespace) -> MemoryForget:
    """The one way to forget the arguments name; argparse cannot express "exactly one"."""
    given = sum((bool(args.memory_ids), args.session is not None, args.all))
    if given != 1:
        raise SystemExit("runbus memory forget: give memory ids, --session S, or --all (one)")
    return MemoryForget(memory_ids=args.memory_ids, session_id=args.session, everything=args.all)


def rows(hits: list[MemoryHit], *, scored: bool = False, audit: bool = False) -> str:
    header = ("SCORE",) * scored + ("CREATED", "SESSION", "MEMORY") + ("STATUS",) * audit
    return table(
        (*header, "TEXT"),
        (
            [
                *([f"{hit.score:.2f}"] * scored),
                f"{hit.created_at:%Y-%m-%d %H:%M}",
                hit.session_id,
                hit.memory_id,
                *([_status(hit)] * audit),
                hit.text,
            ]
            for hit in hits
        ),
    )


def _status(hit: MemoryHit) -> str:
    if hit.status == "superseded" and hit.superseded_by:
        return f"superseded by {hit.superseded_by}"
    return hit.status


def _print_json(value: object) -> None:
    sys.stdout.write(msgspec.json.encode(value).decode() + "\n")


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    forget = forget_request(args) if args.action == "forget" else None
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        match args.action:
            case "list":
                memories = await _list(client, args.session, args.limit, args.retired)
                if args.json:
                    _print_json(memories)
                else:
                    print(rows(memories, audit=args.retired))
            case "search":
                found = await client.call(
                    ops.MEMORY_FIND, MemorySearch(query=args.query, limit=args.limit)
                )
                if args.json:
                    _print_json(found.hits)
                else:
                    print(rows(found.hits, scored=True))
            case "forget":
                assert forget is not None
                forgotten = await client.call(ops.MEMORY_FORGET, forget)
                if args.json:
                    _print_json(forgotten)
                else:
                    print(f"forgot {forgotten.forgotten} memories")
            case "stats":
                stats = await client.call(ops.MEMORY_STATS, MemoryStats())
                if args.json:
                    _print_json(stats)
                else:
                    print(
                        f"{stats.memories} memories; embedder {stats.embedder} "
                        f"({stats.dimension} dimensions), store {stats.store}, "
                        f"{stats.pending_writes} writes pending"
                    )
    return 0


async def _list(
    client: RunbusClient, session_id: str | None, limit: int, retired: bool
) -> list[MemoryHit]:
    """The newest `limit` memories (retired ones too for an audit read): pages come in id
    order, so every page is read first."""
    memories: list[MemoryHit] = []
    cursor: str | None = None
    while True:
        page = await client.call(
            ops.MEMORY_LIST,
            MemoryList(session_id=session_id, limit=PAGE, cursor=cursor, include_retired=retired),
        )
        memories.extend(page.memories)
        cursor = page.next_cursor
        if cursor is None:
            break
    return sorted(memories, key=lambda m: m.created_at, reverse=True)[:limit]
