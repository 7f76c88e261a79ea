"""`runbus http`: the HTTP ingress in the foreground (runs over HTTP/SSE, OpenAI-compatible and
AG-UI endpoints, the web console) for clients without NATS."""

import argparse
import os
import sys

from ..settings import Settings
from ._common import StackNotRunning, Subparsers, stack_url

# Started by name, like `runbus serve`: `runbus` never imports a service package.
INGRESS_MODULE = "runbus_ingress"


def register(subparsers: Subparsers) -> None:
    http = subparsers.add_parser(
        "http",
        help="serve runs over HTTP and Server-Sent Events (OpenAI-compatible, AG-UI, web console)",
    )
    http.add_argument("--host", default=None, help="address to listen on (RUNBUS_HTTP_HOST)")
    http.add_argument("--port", type=int, default=None, help="port (RUNBUS_HTTP_PORT)")
    http.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    host = settings.http_host if args.host is None else args.host
    port = settings.http_port if args.port is None else args.port
    try:
        stack_url(settings)
    except StackNotRunning as exc:
        # It serves anyway (the console, /openapi.json): API requests get 503 until a stack is up.
        print(f"runbus http: {exc}; until then API requests are answered 503", file=sys.stderr)
    argv = [sys.executable, "-m", INGRESS_MODULE, "--host", host, "--port", str(port)]
    os.execv(sys.executable, argv)
