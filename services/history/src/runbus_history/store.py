"""The JetStream side of history: one stream, one subject per tenant and session."""

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import APIError

from runbus import jetstream, subjects
from runbus.headers import (
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
    MSG_ID,
)

DUPLICATE_WINDOW: Final = 120.0
DIRECT_GET_BATCH: Final = 256
WRONG_LAST_SEQUENCE: Final = 10071
"""JetStream's error code for a publish whose expected last subject sequence did not hold."""


async def ensure_stream(
    nc: NATS, *, replicas: int = 1, max_age: float = 0.0, max_per_session: int = 0
) -> None:
    config = StreamConfig(
        name=subjects.HISTORY_STREAM,
        subjects=[subjects.HISTORY_LOG_ALL],
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW,
        allow_direct=True,
        num_replicas=replicas,
        max_age=max_age or None,
        max_msgs_per_subject=max_per_session or -1,
    )
    await jetstream.ensure_stream(nc, config)


async def append(nc: NATS, subject: str, data: bytes, msg_id: str) -> int | None:
    """Store one batch: its stream sequence, or None if JetStream had it already (a retried
    append)."""
    ack = await nc.jetstream().publish(subject, data, headers={MSG_ID: msg_id})
    return None if ack.duplicate else ack.seq


async def append_after(
    nc: NATS, subject: str, data: bytes, msg_id: str, *, log: str, end: int
) -> bool:
    """Store one message on `subject` only while the messages stored on `log` still end at
    stream sequence `end`; False (nothing stored) when something was stored there since."""
    headers = {
        MSG_ID: msg_id,
        EXPECTED_LAST_SUBJECT_SEQUENCE: str(end),
        EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: log,
    }
    try:
        await nc.jetstream().publish(subject, data, headers=headers)
    except APIError as exc:
        if exc.err_code == WRONG_LAST_SEQUENCE:
            return False
        raise
    return True


async def purge(nc: NATS, subject: str) -> None:
    """Remove every message stored on `subject`."""
    await nc.jetstream().purge_stream(subjects.HISTORY_STREAM, subject=subject)


async def last(nc: NATS, subject: str, timeout: float) -> tuple[int, bytes] | None:
    """The stream sequence and data of the newest message on `subject`, or None (one direct
    get)."""
    api = f"$JS.API.DIRECT.GET.{subjects.HISTORY_STREAM}"
    request = json.dumps({"last_by_subj": subject}).encode()
    msg = await nc.request(api, request, timeout=timeout)
    headers = msg.headers or {}
    status = headers.get("Status")
    if status == "404":
        return None
    if status:
        raise RuntimeError(f"direct get failed: {status} {headers.get('Description')}")
    return int(headers["Nats-Sequence"]), msg.data


async def read_subject(
    nc: NATS, subject: str, timeout: float, start: int = 1
) -> AsyncGenerator[tuple[int, bytes], None]:
    """Every message stored on `subject` from stream sequence `start` on, oldest first, with
    its sequence, by batched direct gets.

    One request returns up to DIRECT_GET_BATCH messages followed by an end-of-batch status,
    so a session loads in one round trip per batch instead of a consumer per load.
    """
    api = f"$JS.API.DIRECT.GET.{subjects.HISTORY_STREAM}"
    next_seq = start
    while True:
        inbox = nc.new_inbox()
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def collect(msg: Msg, queue: asyncio.Queue[Msg] = queue) -> None:
            queue.put_nowait(msg)

        sub = await nc.subscribe(inbox, cb=collect)
        try:
            request = {"seq": next_seq, "next_by_subj": subject, "batch": DIRECT_GET_BATCH}
            await nc.publish(api, json.dumps(request).encode(), reply=inbox)
            pending = 0
            while True:
                try:
                    msg = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    raise nats.errors.TimeoutError from None
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "404":
                    return
                if status == "204":
                    break
                if status:
                    raise RuntimeError(f"direct get failed: {status} {headers.get('Description')}")
                sequence = int(headers["Nats-Sequence"])
                yield sequence, msg.data
                next_seq = sequence + 1
                pending = int(headers.get("Nats-Num-Pending", "0"))
        finally:
            await sub.unsubscribe()
        if pending == 0:
            return
