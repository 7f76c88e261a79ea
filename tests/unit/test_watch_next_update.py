"""Waiting for a KV watcher's next entry honours a cancel even when the entry came with it:
Python 3.11's `asyncio.wait_for` (inside nats-py's watcher) returns the entry and drops the
cancel, and a run cancelled while it waited for an approval then waited on."""

import asyncio
from typing import Any, cast

import pytest
from nats.js.kv import KeyValue

from runbus.jetstream import next_update


class EntryWithTheCancel:
    """A watcher that behaves as `wait_for` does when the entry and the cancel meet."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()

    async def updates(self, timeout: float) -> Any:
        self.waiting.set()
        try:
            await asyncio.get_running_loop().create_future()  # until the cancel
        except asyncio.CancelledError:
            return "entry"  # the cancel is swallowed, the entry returned
        raise AssertionError("only a cancel ends this wait")


async def test_a_cancel_that_came_with_an_entry_still_cancels_the_waiter() -> None:
    watcher = EntryWithTheCancel()
    task = asyncio.ensure_future(next_update(cast(KeyValue.KeyWatcher, watcher), timeout=30))
    await watcher.waiting.wait()

    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_entry_without_a_cancel_is_returned() -> None:
    entry = cast(KeyValue.Entry, object())

    class Ready:
        async def updates(self, timeout: float) -> KeyValue.Entry:
            return entry

    assert await next_update(cast(KeyValue.KeyWatcher, Ready()), timeout=1) is entry
