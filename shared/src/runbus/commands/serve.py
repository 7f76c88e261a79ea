"""`runbus serve <service>`: one service in the foreground (scale by starting more)."""

import argparse
import os
import sys

from ..settings import Settings
from ..supervisor import SERVICES
from ._common import Subparsers


def register(subparsers: Subparsers) -> None:
    serve = subparsers.add_parser("serve", help="run one service in the foreground")
    serve.add_argument("service", choices=SERVICES, help="the service to run")
    serve.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    os.execv(sys.executable, [sys.executable, "-m", f"runbus_{args.service}"])
