"""`runbus demo` (what `make run` runs): the embedded stack, a short conversation, stop."""

import argparse
import sys

from ..demo import run_demo
from ..settings import Settings
from ._common import Subparsers


def register(subparsers: Subparsers) -> None:
    demo = subparsers.add_parser("demo", help="start the embedded stack, run the demo, stop")
    demo.add_argument(
        "--model",
        choices=["offline", "local"],
        default="offline",
        help="offline: the rule-based stand-in (default); local: SmolLM2-135M on llama.cpp",
    )
    demo.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    return await run_demo(settings, sys.stdout, args.model)
