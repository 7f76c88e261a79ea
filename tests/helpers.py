"""Test helpers that speak to runbus the way any NATS client would (raw JSON and headers), and
a few over the SDK that several test modules share."""

import asyncio
import inspect
import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from runbus.client import RunbusClient
from runbus.messages import RunApprovalRequested, RunCompleted, RunFailed

TERMINAL = ("run.completed", "run.failed")
POLL: float = 0.01
"""Seconds between two looks of `eventually` at a fact no event announces."""

T = TypeVar("T")


@overload
async def eventually(
    condition: Callable[[], Awaitable[T]],
    timeout: float = ...,
    *,
    retrying: tuple[type[BaseException], ...] = ...,
    what: str = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T],
    timeout: float = ...,
    *,
    retrying: tuple[type[BaseException], ...] = ...,
    what: str = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    condition: Callable[[], Awaitable[T] | T],
    timeout: float = 10.0,
    *,
    retrying: tuple[type[BaseException], ...] = (),
    what: str = "",
    interval: float = POLL,
) -> T:
    """Wait until `condition()` (sync or async) returns something truthy and return it.

    For facts that no event announces (a KV entry, a counter, a log line, a consumer's
    state): the one place tests poll. An exception in `retrying` counts as "not yet". After
    `timeout` seconds it fails with the condition's last value.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = condition()
            result = await value if inspect.isawaitable(value) else value
        except retrying as error:
            last = error
        else:
            if result:
                return result
            last = result
        if time.monotonic() > deadline:
            name = what or getattr(condition, "__qualname__", repr(condition))
            raise AssertionError(f"{name} not true within {timeout}s; last: {last!r}")
        await asyncio.sleep(interval)


async def take_time(seconds: float) -> None:
    """Let `seconds` pass on purpose: a stand-in for a slow tool or provider, the period of a
    background reconciliation, a random moment for a disruption. Never to wait for another
    task or to prove that something did not happen (that is `eventually` on a fact)."""
    await asyncio.sleep(seconds)


def raw_request(run_id: str, text: str, *, agent: str = "travel", session_id: str = "s1") -> bytes:
    """A run request (`run.request`) as plain JSON, the way any NATS client can send one."""
    return json.dumps(
        {
            "type": "run.request",
            "run_id": run_id,
            "agent": agent,
            "session_id": session_id,
            "input": [{"role": "user", "contents": [{"type": "text", "text": text}]}],
        }
    ).encode()


async def publish_and_collect(
    nc: NATS,
    run_id: str,
    body: bytes,
    *,
    subject: str = "runbus.runs.travel",
    token: str | None = "dev-alice",
    extra_headers: dict[str, str] | None = None,
    timeout: float = 20.0,
) -> list[dict[str, Any]]:
    """Publish a run request with plain nats-py and return its events up to the final one."""
    subscription = await nc.subscribe(f"runbus.events.*.*.{run_id}")
    headers = {"Nats-Msg-Id": run_id, **(extra_headers or {})}
    if token is not None:
        headers["rb-auth"] = f"Bearer {token}"
    await nc.jetstream().publish(subject, body, headers=headers)
    events: list[dict[str, Any]] = []
    try:
        while not events or events[-1]["type"] not in TERMINAL:
            msg = await subscription.next_msg(timeout=timeout)
            events.append(msgspec.json.decode(msg.data))
    finally:
        await subscription.unsubscribe()
    return events


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def approval_requested(
    client: RunbusClient, run_id: str, *, timeout: float = 20
) -> RunApprovalRequested:
    """Follow the run until it asks for a person's approval; fail if it ends first."""
    async for item in client.follow(run_id, timeout=timeout):
        if isinstance(item.event, RunApprovalRequested):
            return item.event
        assert not isinstance(item.event, RunCompleted | RunFailed), item.event
    raise AssertionError(f"run {run_id} asked for no approval")


async def refused_raw(url: str, **options: Any) -> str:
    """What the server says to a plain nats-py connect (which must fail)."""
    nc = NATS()
    try:
        with pytest.raises(nats.errors.Error) as refused:
            await nc.connect(url, allow_reconnect=False, max_reconnect_attempts=0, **options)
    finally:
        await nc.close()
        if nc._transport is not None:  # nats-py leaves a refused socket open
            nc._transport.close()  # type: ignore[no-untyped-call]
    return str(refused.value)


def measured_commit() -> str:
    """The commit a report measured (`+dirty` when the tree differs from it), for the chaos
    and cluster reports' headings."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], check=False).returncode
    return out.stdout.strip() + ("+dirty" if dirty else "")
