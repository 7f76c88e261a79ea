"""An MCP stdio server that misbehaves on request, speaking raw JSON-RPC so it can do what
a well-made SDK server never would: `crash` exits mid-call, `hang` never answers (and writes
each `notifications/cancelled` it gets to the file named by `ROGUE_LOG`), `garbage` answers
with a result that is not MCP, `freeze` stops reading its input (pings too), `babble` prints a
stray line first, `picture` draws 10 KiB, `grow` adds a tool and says the list changed.
`echo` behaves."""

import base64
import json
import os
import sys
import threading
from typing import Any

ECHO = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
EMPTY = {"type": "object", "properties": {}}
PICTURE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
tools: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Say it back.",
        "inputSchema": ECHO,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "whoami",
        "description": "Who the server was told is calling.",
        "inputSchema": {
            "type": "object",
            "properties": {"user": {"type": "string"}},
            "required": ["user"],
        },
        "annotations": {"readOnlyHint": True},
    },
    {"name": "crash", "description": "Exit mid-call.", "inputSchema": EMPTY},
    {
        "name": "hang",
        "description": "Never answer.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "garbage",
        "description": "Answer with a non-MCP result.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "huge",
        "description": "Answer with far too much text.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "fail",
        "description": "Report an error.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {"name": "grow", "description": "Add a tool.", "inputSchema": EMPTY},
    {
        "name": "babble",
        "description": "Print a stray line, then answer.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "picture",
        "description": "Draw a picture.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "freeze",
        "description": "Stop reading anything.",
        "inputSchema": EMPTY,
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "oddly",
        "description": "A schema that is not JSON Schema.",
        "inputSchema": {"type": "object", "properties": {"a": {"type": "nonsense"}}},
    },
]
if os.environ.get("ROGUE_STRING_SCHEMA"):
    # Not even MCP: an input schema must describe an object.
    tools.append({"name": "stringly", "inputSchema": {"type": "string"}})


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def note(line: str) -> None:
    with open(os.environ["ROGUE_LOG"], "a") as log:
        log.write(line + "\n")


def text(said: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": said}]}


def answer(call: dict[str, Any]) -> dict[str, Any] | None:
    name, arguments = call["name"], call.get("arguments") or {}
    if name == "echo":
        return text(arguments["text"])
    if name == "whoami":
        return text(f"user={arguments.get('user')} secret={os.environ.get('ROGUE_SECRET')}")
    if name == "crash":
        os._exit(3)
    if name == "hang":
        return None
    if name == "babble":
        sys.stdout.write("Loading plugins... done\n")
        return text("babbled")
    if name == "picture":
        drawn = base64.b64encode(PICTURE).decode()
        return {
            "content": [
                {"type": "text", "text": "a grey square"},
                {"type": "image", "data": drawn, "mimeType": "image/png"},
            ]
        }
    if name == "freeze":
        threading.Event().wait()  # blocks the only thread: nothing more is read
    if name == "garbage":
        return {"content": "this is not a list of content blocks"}
    if name == "huge":
        return text("x" * 200_000)
    if name == "fail":
        return {
            "content": [{"type": "text", "text": "the flux capacitor is empty"}],
            "isError": True,
        }
    if name == "grow":
        tools.append({"name": "grown", "description": "Appeared later.", "inputSchema": EMPTY})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text("grew")
    return text(f"{name} ran")


def main() -> None:
    note(f"started {os.getpid()}")
    for line in sys.stdin:
        request = json.loads(line)
        method, rid = request.get("method"), request.get("id")
        if method == "notifications/cancelled":
            note(f"cancelled {request['params']['requestId']}")
            continue
        if rid is None:
            continue
        if method == "initialize":
            result: dict[str, Any] | None = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {"listChanged": True}},
                "serverInfo": {"name": "rogue", "version": "1"},
            }
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": tools}
        elif method == "tools/call":
            note(f"call {request['params']['name']}")
            result = answer(request["params"])
            if result is None:
                continue
        else:
            send(
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32601, "message": "no such method"},
                }
            )
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": result})


if __name__ == "__main__":
    main()
