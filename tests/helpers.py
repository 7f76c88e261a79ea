"""Test helpers that speak to runbus the way any NATS client would (raw JSON and headers), and
a few over the SDK that several test modules share."""

import json
from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from runbus.client import RunbusClient
from runbus.messages import RunApprovalRequested, RunCompleted, RunFailed

TERMINAL = ("run.completed", "run.failed")


def raw_request(run_id: str, text: str, *, agent: str = "travel", session_id: str = "s1") -> bytes:
    """The run request of DESIGN §5, as plain JSON."""
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
    subscription = await nc.subscribe(f"runbus.events.{run_id}")
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
