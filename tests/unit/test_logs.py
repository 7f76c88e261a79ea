"""Log lines of any size: a field too long is cut with a marker, and a child's output line of
any length is read whole (up to a limit) without stopping the reader."""

import asyncio
import logging
import sys

import structlog

from runbus.logs import MAX_FIELD, LibraryRecords, read_lines, truncate_fields


def test_a_field_longer_than_the_limit_is_cut_with_a_marker_saying_how_much() -> None:
    event = truncate_fields(None, "info", {"event": "model_prompt_sent", "prompt": "p" * 200_000})

    assert len(event["prompt"]) < MAX_FIELD + 100
    assert event["prompt"].endswith(f"…[truncated {200_000 - MAX_FIELD} of 200000 chars]")
    assert event["event"] == "model_prompt_sent"


def test_a_long_list_field_is_cut_as_its_json_text() -> None:
    messages = [{"role": "user", "text": "x" * 1000}] * 100

    event = truncate_fields(None, "info", {"event": "e", "messages": messages, "n": 3})

    assert isinstance(event["messages"], str)
    assert "…[truncated" in event["messages"]
    assert event["n"] == 3


def test_short_fields_are_left_as_they_are() -> None:
    fields = {"event": "run_completed", "run_id": "r-1", "tools": ["a", "b"]}

    assert truncate_fields(None, "info", dict(fields)) == fields


def test_a_processed_log_line_stays_small_whatever_it_was_given() -> None:
    with structlog.testing.capture_logs(processors=[truncate_fields]) as logs:
        structlog.get_logger().info("model_prompt_sent", prompt="p" * 300_000)

    assert len(logs[0]["prompt"]) < MAX_FIELD + 100


async def _lines_of(data: bytes, limit: int) -> list[tuple[bytes, int]]:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return [line async for line in read_lines(stream, limit, chunk=4096)]


async def test_a_line_of_300_kib_is_read_whole_and_the_next_line_after_it() -> None:
    big = b"x" * 300 * 1024

    assert await _lines_of(big + b"\n" + b'{"event":"after"}\n', 1 << 20) == [
        (big, 0),
        (b'{"event":"after"}', 0),
    ]


async def test_a_line_over_the_limit_is_cut_and_says_how_many_bytes_were_cut() -> None:
    lines = await _lines_of(b"y" * 10_000 + b"\nnext\nlast without newline", 1000)

    assert lines == [(b"y" * 1000, 9000), (b"next", 0), (b"last without newline", 0)]


def test_a_library_error_with_a_traceback_is_one_structured_event_naming_the_exception() -> None:
    try:
        raise asyncio.InvalidStateError("invalid state")
    except asyncio.InvalidStateError:
        record = logging.LogRecord(
            "nats.aio.client",
            logging.ERROR,
            __file__,
            1,
            "nats: encountered error",
            None,
            sys.exc_info(),
        )
    with structlog.testing.capture_logs() as logs:
        LibraryRecords().emit(record)

    assert logs == [
        {
            "event": "nats: encountered error",
            "logger": "nats.aio.client",
            "error": "InvalidStateError('invalid state')",
            "log_level": "error",
        }
    ]
