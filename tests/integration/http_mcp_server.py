"""A streamable HTTP MCP server (the `mcp` SDK's own) that answers only requests bearing the
token in `MCP_TOKEN`. It listens on a free port of 127.0.0.1 and prints that port first."""

import asyncio
import os
import socket
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

server = MCPServer("web")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def guarded(app: ASGIApp, token: str) -> ASGIApp:
    async def check(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        if scope["type"] == "http" and headers.get(b"authorization") != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"who are you?"})
            return
        await app(scope, receive, send)

    return check


async def main() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # connections wait in the backlog until the server accepts them
    print(listener.getsockname()[1], flush=True)
    app = guarded(server.streamable_http_app(), os.environ["MCP_TOKEN"])
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[listener])


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
