"""Server-Sent Events framing of run events, and keepalives for idle streams."""

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final, TypeVar

from aiohttp import hdrs, web

from runbus.messages import RunEvent, encode

T = TypeVar("T")

CONTENT_TYPE: Final = "text/event-stream"
KEEPALIVE: Final = b": keepalive\n\n"
"""An SSE comment: clients ignore it, proxies see traffic and keep the connection open."""


def event_type(event: RunEvent) -> str:
    """The event's wire tag (`run.text_delta`, `run.completed`, …)."""
    return str(event.__struct_config__.tag)


def frame(seq: int, event: RunEvent) -> bytes:
    """One SSE event: `id` is the event's stream sequence, so a reconnecting EventSource sends
    it back as `Last-Event-ID` and resumes right after it."""
    # Compact JSON has no raw newline (they are escaped inside strings): one `data:` line.
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, event_type(event).encode(), encode(event))


async def _next(items: AsyncIterator[T]) -> T:
    return await anext(items)


async def with_keepalives(
    items: AsyncIterator[T], interval: float
) -> AsyncGenerator[T | None, None]:
    """Every item of `items`, and None each time `interval` seconds pass without one."""
    pending = asyncio.ensure_future(_next(items))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
            pending = asyncio.ensure_future(_next(items))
    finally:
        # Let a pending read unwind before the caller closes `items` (a generator cannot be
        # closed while a read is running in it).
        pending.cancel()
        await asyncio.wait({pending})
        if not pending.cancelled():
            pending.exception()  # a failure after the stream ended is not worth a warning


async def open_stream(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    """A prepared `text/event-stream` response that proxies pass on event by event."""
    response = web.StreamResponse(
        headers={
            **headers,
            hdrs.CONTENT_TYPE: CONTENT_TYPE,
            hdrs.CACHE_CONTROL: "no-cache",
            "X-Accel-Buffering": "no",  # nginx: pass each event on at once
        }
    )
    await response.prepare(request)
    return response


def data_frame(data: bytes, *, event: str | None = None) -> bytes:
    """An SSE event with only `data:` (and an optional `event:`), as OpenAI and AG-UI send."""
    head = b"event: %s\n" % event.encode() if event else b""
    return head + b"data: " + data + b"\n\n"
