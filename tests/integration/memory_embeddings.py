"""A loopback embeddings provider speaking OpenAI's `POST /v1/embeddings` over real HTTP/1.1
(keep-alive, JSON errors), so the memory service's production client code is what tests run.
Vectors are the hashing embedder's, scaled (not unit length, as some servers send them)."""

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from runbus_memory.embedder import HashingEmbedder

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 500: "Internal Server Error"}


@dataclass
class EmbeddingsProvider:
    dimension: int = 384
    """Vector size sent when the request names none (or always, see `honour_dimensions`)."""
    honour_dimensions: bool = True
    """Answer the `dimensions` a request asks for; False mimics a server that ignores it."""
    status: int = 200
    """Status of every answer; anything but 200 sends an OpenAI-style JSON error."""
    reverse: bool = False
    """Send the vectors in reverse order (their `index` still says where each belongs)."""
    hold: asyncio.Event | None = None
    """When set to an unset Event, requests wait until it is set (a hung provider)."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    url: str = ""
    received: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a request has arrived."""
    connections: set[asyncio.StreamWriter] = field(default_factory=set)

    async def _answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append(body)
        self.received.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.status != 200:
            return self.status, {"error": {"message": "provider failed", "type": "server_error"}}
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        asked = body.get("dimensions") if self.honour_dimensions else None
        size = int(asked or self.dimension)
        vectors = HashingEmbedder(size).vectors(texts)
        data = [
            {"object": "embedding", "index": i, "embedding": [3.0 * v for v in vector]}
            for i, vector in enumerate(vectors)
        ]
        if self.reverse:
            data.reverse()
        return 200, {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                self.authorizations.append(headers.get("authorization", ""))
                if not lines[0].startswith("POST ") or " /v1/embeddings " not in lines[0]:
                    status, answer = 400, {"error": {"message": f"unexpected {lines[0]!r}"}}
                else:
                    status, answer = await self._answer(json.loads(raw))
                payload = json.dumps(answer).encode()
                writer.write(
                    f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
                    "content-type: application/json\r\n"
                    f"content-length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.connections.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@asynccontextmanager
async def embeddings_provider(**options: Any) -> AsyncIterator[EmbeddingsProvider]:
    provider = EmbeddingsProvider(**options)
    server = await asyncio.start_server(provider._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    provider.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield provider
    finally:
        if provider.hold is not None:
            provider.hold.set()
        server.close()
        for writer in list(provider.connections):  # keep-alive connections outlive `close`
            writer.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2)
