"""The `runbus` command. Subcommands live in `runbus.commands`, one module each."""

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import nats.errors
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
        return _say(f"{exc}", 1)
    except KeyboardInterrupt:
        return _say("interrupted", 130)
    except BrokenPipeError:
        # The reader went away (`runbus logs … | head`): nothing more to say, to anyone.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except nats.errors.Error as exc:
        # The connection went away under a command (NATS stopped, the stack went down).
        return _say(
            f"lost the connection to NATS ({_reason(exc)}); check the stack with "
            "`runbus status`, or start it with `runbus up`",
            1,
        )
    except OSError as exc:
        return _say(_reason(exc), 1)
    return code


def _reason(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


def _say(text: str, code: int) -> int:
    """One line on stderr, never a traceback, for a condition a user can meet."""
    print(f"runbus: {text}", file=sys.stderr, flush=True)
    return code
