"""structlog setup: JSON lines (or pretty on a TTY) that carry trace_id and span_id, with
oversized fields cut; and the reader of a child's output whatever the length of its lines."""

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from typing import Final

import msgspec
import structlog
from opentelemetry import trace
from structlog.typing import EventDict, WrappedLogger

MAX_FIELD: Final = 16_384
"""Characters a logged field keeps; the rest is cut and the cut is said (a prompt audit of a
200 KB prompt must not make a 200 KB log line)."""
_TRUNCATED: Final = "…[truncated {cut} of {total} chars]"
_ENCODER: Final = msgspec.json.Encoder()


def add_trace_ids(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """Stamp the current span's ids so a log line can be found from its trace and back."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event


def truncate(text: str, limit: int = MAX_FIELD) -> str:
    """`text`, or its first `limit` characters and a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + _TRUNCATED.format(cut=len(text) - limit, total=len(text))


def truncate_fields(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """Cut any field longer than `MAX_FIELD` characters; a list or mapping that long becomes
    its cut JSON text."""
    for key, value in event.items():
        if isinstance(value, str):
            if len(value) > MAX_FIELD:
                event[key] = truncate(value)
        elif isinstance(value, (list, tuple, dict)) and value:
            try:
                text = _ENCODER.encode(value).decode()
            except (TypeError, ValueError, UnicodeDecodeError):
                text = repr(value)
            if len(text) > MAX_FIELD:
                event[key] = truncate(text)
    return event


class LibraryRecords(logging.Handler):
    """Libraries' own log records as one structured line each, with the exception's repr in
    place of its traceback: nats-py logs "encountered error" with a traceback from its read
    loop (e.g. a reply that lands on a request cancelled during a stop), which would
    otherwise reach stderr as raw multi-line output."""

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, object] = {"logger": record.name}
        if record.exc_info and record.exc_info[1] is not None:
            fields["error"] = repr(record.exc_info[1])
        structlog.get_logger().log(record.levelno, record.getMessage(), **fields)


def configure_logging(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog for a process; JSON unless stderr is a terminal. Records of the
    standard `logging` module (libraries) go through structlog too, warnings and above."""
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_ids,
            structlog.processors.format_exc_info,
            truncate_fields,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    root.handlers[:] = [LibraryRecords()]
    root.setLevel(logging.WARNING)


async def read_lines(
    stream: asyncio.StreamReader, limit: int, chunk: int = 65_536
) -> AsyncIterator[tuple[bytes, int]]:
    """Every line of `stream` (without its newline), cut to `limit` bytes, with how many bytes
    were cut. Unlike `StreamReader.readline`, no line is too long: the reader of a child's
    output must never stop, or the child blocks on a full pipe."""
    kept = bytearray()
    cut = 0
    while data := await stream.read(chunk):
        start = 0
        while True:
            end = data.find(b"\n", start)
            piece = data[start:] if end == -1 else data[start:end]
            room = max(limit - len(kept), 0)
            kept += piece[:room]
            cut += max(len(piece) - room, 0)
            if end == -1:
                break
            yield bytes(kept), cut
            kept.clear()
            cut = 0
            start = end + 1
    if kept or cut:
        yield bytes(kept), cut
