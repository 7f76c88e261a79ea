"""A loopback OpenAI-compatible chat-completions server with a fixed latency, playing the bench's
3-tool script (get_weather, search_flights, create_booking, then the answer) by where the
conversation stands: the Nth assistant reply after the last user message. It runs in its own
process (`python -m bench.loopback_model --latency 0.3`, first stdout line `port <n>`), so
its CPU and memory are nobody's run cost. Streams (SSE) or answers whole, as asked."""

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

SCRIPT: list[tuple[str, dict[str, Any]] | str] = [
    ("get_weather", {"city": "Sydney"}),
    ("search_flights", {"origin": "Melbourne", "destination": "Sydney", "date": "2026-12-08"}),
    ("create_booking", {"flight_id": "QF412-20261208"}),
    "Booked: {last_result}",
]


def reply_for(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message the script gives at this point of the conversation."""
    turn: list[dict[str, Any]] = []
    for message in messages:
        turn = [] if message.get("role") == "user" else [*turn, message]
    step = sum(1 for m in turn if m.get("role") == "assistant")
    planned = SCRIPT[min(step, len(SCRIPT) - 1)]
    if isinstance(planned, str):
        results = [m for m in turn if m.get("role") == "tool"]
        last = results[-1].get("content", "") if results else ""
        if isinstance(last, list):
            last = "".join(part.get("text", "") for part in last)
        return {"role": "assistant", "content": planned.replace("{last_result}", str(last))}
    name, arguments = planned
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "bench-300ms",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


USAGE = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    await asyncio.sleep(request.app["latency"])
    message = reply_for(body.get("messages", []))
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    if not body.get("stream"):
        return web.json_response(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "bench-300ms",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": USAGE,
            }
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if message.get("tool_calls"):
        calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        await response.write(_chunk({"role": "assistant", "tool_calls": calls}))
    else:
        await response.write(_chunk({"role": "assistant", "content": message["content"]}))
    await response.write(_chunk({}, finish))
    usage = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "bench-300ms",
        "choices": [],
        "usage": USAGE,
    }
    await response.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response


async def serve(latency: float) -> None:
    app = web.Application()
    app["latency"] = latency
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = runner.addresses[0][1]
    print(f"port {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    import uvloop

    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.3)
    uvloop.run(serve(parser.parse_args().latency))
