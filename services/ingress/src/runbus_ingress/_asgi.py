"""One aiohttp request served by an ASGI application (the `mcp` SDK's streamable HTTP server):
the request as an ASGI scope and its body as one `http.request` message, the application's
answer streamed back as it sends it."""

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import web

from runbus.errors import Unavailable

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]


async def serve(app: AsgiApp, request: web.Request, extra: dict[str, Any]) -> web.StreamResponse:
    """`request` answered by `app`; `extra` joins the ASGI scope (what the app's handlers read
    back from their request's scope)."""
    # Read whole so the ingress's body limit holds (413 before the app sees anything).
    body = await request.read()
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.encode("latin-1"),
        "root_path": "",
        "query_string": request.query_string.encode("latin-1"),
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": _peer(request),
        "server": None,
        **extra,
    }
    bridge = _Bridge(request, body)
    await app(scope, bridge.receive, bridge.send)
    if bridge.response is None:
        raise Unavailable("the MCP server ended the request without an answer")
    return bridge.response


class _Bridge:
    def __init__(self, request: web.Request, body: bytes) -> None:
        self.request = request
        self.body: bytes | None = body
        self.response: web.StreamResponse | None = None
        self.ended = asyncio.Event()

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        # After the body, an ASGI app reads again only to learn of a disconnect. A client that
        # hangs up cancels this whole handler (the app with it), so the one disconnect left to
        # report is the end of the answer.
        await self.ended.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        match message["type"]:
            case "http.response.start":
                started = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", ()):
                    started.headers.add(name.decode("latin-1"), value.decode("latin-1"))
                self.response = started
            case "http.response.body":
                response = self.response
                if response is None or self.ended.is_set():
                    raise RuntimeError("ASGI body sent before its start or after its end")
                if not response.prepared:
                    await response.prepare(self.request)
                chunk = message.get("body", b"")
                if chunk:
                    await response.write(chunk)
                if not message.get("more_body", False):
                    await response.write_eof()
                    self.ended.set()
            case _:
                pass  # no extension (trailers, pathsend) is offered in the scope


def _peer(request: web.Request) -> tuple[str, int] | None:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(peer[0]), int(peer[1])
    return None
