"""A loopback OpenAI-compatible chat-completions server with a fixed latency, playing the bench's
3-tool script (get_weather, search_flights, create_booking, then the answer) by where the
conversation stands: the Nth assistant reply after the last user message. It runs in its own
process (`python -m bench.loopback_model --latency 0.3`, first stdout line `port <n>`), so
its CPU and memory are nobody's run cost. Streams (SSE) or answers whole, as asked.

It measures itself, so a bench can tell whether the model server is what bounds a level:
`GET /v1/bench/stats` answers (and starts afresh) how late it answered (past the latency,
from the moment the request body was in), how long callers took to send their bodies, the
lag of its event loop, and its CPU and wall-clock seconds since the last answer."""

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

SCRIPT: list[tuple[str, dict[str, Any]] | str] = [
    ("get_weather", {"city": "Sydney"}),
    ("search_flights", {"origin": "Melbourne", "destination": "Sydney", "date": "2026-12-08"}),
    ("create_booking", {"flight_id": "QF412-20261208"}),
    "Booked: {last_result}",
]


@dataclass
class ModelServer:
    """The loopback model server's base URL and process id."""

    url: str
    pid: int

    def stats(self) -> dict[str, Any]:
        """What the server saw since the last call (and its CPU seconds so far)."""
        with urllib.request.urlopen(f"{self.url}/bench/stats", timeout=10) as reply:
            seen: dict[str, Any] = json.loads(reply.read())
        return seen


@contextlib.contextmanager
def server_process(*command: str) -> Iterator[ModelServer]:
    """A loopback model server (`python -m <command>`, first line `port <n>`) as a child
    process, so its CPU is nobody else's."""
    process = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=Path(__file__).resolve().parent.parent,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"{command[0]} did not start: {line!r}")
        yield ModelServer(f"http://127.0.0.1:{int(line.split()[1])}/v1", process.pid)
    finally:
        process.terminate()
        process.wait(10)


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


LAG_TICK = 0.01
"""Seconds between two looks at the event loop's lag."""


@dataclass
class Stats:
    """What the server saw since the last `/v1/bench/stats`, in ms."""

    late_ms: list[float] = field(default_factory=list)
    """Per call: the answer's end minus (the body in + the latency): the server's own delay."""
    body_ms: list[float] = field(default_factory=list)
    """Per call: the request's headers in to its body in: how slowly the caller sent it."""
    lag_ms: list[float] = field(default_factory=list)
    """The event loop's lag, sampled every LAG_TICK."""
    since: float = field(default_factory=time.perf_counter)
    cpu_since: float = field(default_factory=time.process_time)

    def summary(self) -> dict[str, Any]:
        """The numbers since the last summary (or the start), then a fresh start."""
        wall, cpu = time.perf_counter() - self.since, time.process_time() - self.cpu_since
        out: dict[str, Any] = {"calls": len(self.late_ms), "wall_s": wall, "cpu_s": cpu}
        for name in ("late_ms", "body_ms", "lag_ms"):
            ordered = sorted(getattr(self, name))
            out[name] = {
                "p50": ordered[len(ordered) // 2] if ordered else 0.0,
                "p99": ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0,
                "max": ordered[-1] if ordered else 0.0,
            }
        for samples in (self.late_ms, self.body_ms, self.lag_ms):
            samples.clear()
        self.since, self.cpu_since = time.perf_counter(), time.process_time()
        return out


STATS = web.AppKey("stats", Stats)
LATENCY = web.AppKey("latency", float)


async def watch_lag(stats: Stats) -> None:
    while True:
        start = time.perf_counter()
        await asyncio.sleep(LAG_TICK)
        stats.lag_ms.append((time.perf_counter() - start - LAG_TICK) * 1000)


async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS].summary())


async def completions(request: web.Request) -> web.StreamResponse:
    arrived = time.perf_counter()
    body = await request.json()
    body_in = time.perf_counter()
    seen = request.app[STATS]
    seen.body_ms.append((body_in - arrived) * 1000)
    await asyncio.sleep(request.app[LATENCY])
    message = reply_for(body.get("messages", []))
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    if not body.get("stream"):
        reply = web.json_response(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "bench-300ms",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": USAGE,
            }
        )
        seen.late_ms.append((time.perf_counter() - body_in - request.app[LATENCY]) * 1000)
        return reply
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
    seen.late_ms.append((time.perf_counter() - body_in - request.app[LATENCY]) * 1000)
    return response


async def serve(latency: float) -> None:
    app = web.Application()
    app[LATENCY] = latency
    app[STATS] = Stats()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/bench/stats", stats)
    lag = asyncio.create_task(watch_lag(app[STATS]))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = runner.addresses[0][1]
    print(f"port {port}", flush=True)
    await lag  # forever


if __name__ == "__main__":
    import uvloop

    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.3)
    uvloop.run(serve(parser.parse_args().latency))
