"""`runbus logs <run_id|trace_id>`: the JSON log lines of one run, from every service, in
time order; lines that carry only the run's trace id (a service's own span) are included."""

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import msgspec

from ..settings import Settings
from ._common import Subparsers

# Keys every line has; the human format shows them in fixed places or not at all.
_FIXED = ("timestamp", "level", "event", "service", "run_id", "trace_id", "span_id")


def register(subparsers: Subparsers) -> None:
    logs = subparsers.add_parser(
        "logs", help="log lines of one run (by run id or trace id) from every service"
    )
    # Optional for argparse only: without it, the handler says what is missing in its words.
    logs.add_argument("id", nargs="?", help="a run id (r-…) or a trace id (32 hex digits)")
    logs.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="log files to read, `-` for stdin (default: RUNBUS_DATA_DIR/logs/*.log)",
    )
    logs.add_argument("--json", action="store_true", help="the matching lines as they are")
    logs.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    if not args.id:
        print(
            "runbus logs: which run? give its run id (r-…, printed by `runbus run`, listed by "
            "`runbus runs list`) or a trace id",
            file=sys.stderr,
        )
        return 2
    files: list[Path] = args.files or sorted((settings.data_path / "logs").glob("*.log"))
    if not files:
        print(f"runbus logs: no log files in {settings.data_path / 'logs'}", file=sys.stderr)
        return 1
    matched = select(read_lines(files, sys.stdin), args.id)
    if not matched:
        print(f"runbus logs: no line mentions {args.id!r}", file=sys.stderr)
        return 1
    for source, raw, fields in matched:
        print(raw if args.json else render(source, fields))
    return 0


def read_lines(files: Iterable[Path], stdin: TextIO) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(source, raw line, decoded fields) of every JSON object line; other lines are skipped
    (console-format logs, tracebacks, nats-server's own log)."""
    for path in files:
        if str(path) == "-":
            yield from _decoded("-", stdin)
            continue
        with path.open(encoding="utf-8", errors="replace") as lines:
            yield from _decoded(path.stem, lines)


def _decoded(source: str, lines: Iterable[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for line in lines:
        raw = line.strip()
        if not raw.startswith("{"):
            continue
        try:
            fields = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            continue
        if isinstance(fields, dict):
            yield source, raw, fields


def select(
    lines: Iterable[tuple[str, str, dict[str, Any]]], wanted: str
) -> list[tuple[str, str, dict[str, Any]]]:
    """Lines of `wanted` (a run id or a trace id), plus every line of the traces its lines
    name, ordered by timestamp."""
    candidates = []
    traces = {wanted}
    for source, raw, fields in lines:
        if fields.get("run_id") == wanted and isinstance(fields.get("trace_id"), str):
            traces.add(fields["trace_id"])
        if fields.get("run_id") == wanted or "trace_id" in fields:
            candidates.append((source, raw, fields))
    matched = [
        line
        for line in candidates
        if line[2].get("run_id") == wanted or line[2].get("trace_id") in traces
    ]
    return sorted(matched, key=lambda line: str(line[2].get("timestamp", "")))


def render(source: str, fields: dict[str, Any]) -> str:
    """`time  service  level  event  key=value …` for a person."""
    service = fields.get("service") or source
    extra = " ".join(
        f"{key}={value}" for key, value in fields.items() if key not in _FIXED and value != ""
    )
    level = str(fields.get("level", ""))
    return (
        f"{fields.get('timestamp', '')}  {service:<13}  {level:<7}  {fields.get('event', '')}"
        f"{'  ' + extra if extra else ''}"
    )
