"""runbus agents from any MCP client: the `mcp` SDK's own client against `runbus http`.

    .venv/bin/runbus up                                     # terminal 1: the stack
    .venv/bin/runbus http                                   # terminal 2: http://127.0.0.1:8080
    .venv/bin/python examples/mcp_agents.py "Weather in Sydney?"
    .venv/bin/python examples/mcp_agents.py --session s-… "And in Perth?"

It lists the tools (one per agent the token's user may run), calls one (`--agent`, default
`travel`) and prints its steps as they come (MCP progress notifications), then the answer and
the run and session it made. `RUNBUS_HTTP_URL` and `RUNBUS_TOKEN` (default the dev token
`dev-alice`) say where and as whom.
"""

import argparse
import asyncio
import os
import sys

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def call_agent(url: str, token: str, agent: str, text: str, session_id: str | None) -> int:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        print(f"  … {message}", flush=True)

    headers = {"Authorization": f"Bearer {token}"}
    # A run may take minutes: read its answer as long as the ingress waits on a run (330 s).
    timeout = httpx2.Timeout(30.0, read=330.0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(f"{url}/v1/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        print("tools:", ", ".join(tool.name for tool in listed.tools))
        arguments = {"input": text} | ({"session_id": session_id} if session_id else {})
        result = await session.call_tool(agent, arguments, progress_callback=on_progress)
    answer = "".join(c.text for c in result.content if isinstance(c, types.TextContent))
    meta = result.meta or {}
    print(("error: " if result.is_error else "answer: ") + answer)
    print(f"run {meta.get('runbus/run_id')}, session {meta.get('runbus/session_id')}")
    return 1 if result.is_error else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("text", help="what to say to the agent")
    parser.add_argument("--agent", default="travel")
    parser.add_argument("--session", default=None, help="a session of yours to continue")
    args = parser.parse_args()
    url = os.environ.get("RUNBUS_HTTP_URL", "http://127.0.0.1:8080").rstrip("/")
    token = os.environ.get("RUNBUS_TOKEN", "dev-alice")
    return asyncio.run(call_agent(url, token, args.agent, args.text, args.session))


if __name__ == "__main__":
    sys.exit(main())
