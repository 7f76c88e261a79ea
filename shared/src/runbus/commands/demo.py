"""`runbus demo` (what `make run` runs): the embedded stack, a short conversation, stop."""

import argparse
import sys

from ..demo import run_demo
from ..settings import Settings
from ._common import Subparsers


def register(subparsers: Subparsers) -> None:
    demo = subparsers.add_parser("demo", help="start the embedded stack, run the demo, stop")
    demo.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    return await run_demo(settings, sys.stdout)
