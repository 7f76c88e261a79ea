"""The `runbus` command. Subcommands live in `runbus.commands`, one module each."""

import argparse
import importlib
import sys
from collections.abc import Sequence

import uvloop

from . import __version__
from .commands import MODULES
from .errors import RunbusError
from .logs import configure_logging
from .settings import SettingsError, load_settings
from .supervisor import StackError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runbus", description="runbus: an AI-agent runtime on a NATS bus"
    )
    parser.add_argument("--version", action="version", version=f"runbus {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in MODULES:
        importlib.import_module(f"runbus.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"runbus: bad setting {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    try:
        code: int = uvloop.run(args.handler(settings, args))
    except (RunbusError, StackError) as exc:
        print(f"runbus: {exc}", file=sys.stderr)
        return 1
    return code
