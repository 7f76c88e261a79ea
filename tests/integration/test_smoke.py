import json

import msgspec
from nats.aio.client import Client as NATS

from tests.stack import Stack

RAW = {
    "type": "run.request",
    "run_id": "r-7f3a",
    "agent": "travel",
    "session_id": "s1",
    "input": [{"role": "user", "contents": [{"type": "text", "text": "Weather in Sydney?"}]}],
}


async def test_smoke(stack: Stack, nc: NATS) -> None:
    sub = await nc.subscribe("runbus.events.*.*.r-7f3a")
    js = nc.jetstream()
    await js.publish(
        "runbus.runs.travel",
        json.dumps(RAW).encode(),
        headers={"rb-auth": "Bearer dev-alice", "Nats-Msg-Id": "r-7f3a"},
    )
    events = []
    async for msg in sub.messages:
        ev = msgspec.json.decode(msg.data)
        events.append(ev)
        print(ev["type"], ev.get("text") or ev.get("delta") or ev.get("error") or "")
        if ev["type"] in ("run.completed", "run.failed"):
            break
    assert events[-1]["type"] == "run.completed"
