"""`runbus secrets [DIR]`: the NATS secrets of a deployment (service, auth and monitor
passwords, the auth callout's issuer key), generated once into DIR/secrets with 0600 files."""

import argparse
import sys
from pathlib import Path

from .. import busauth
from ..settings import Settings
from ._common import Subparsers


def register(subparsers: Subparsers) -> None:
    command = subparsers.add_parser(
        "secrets", help="generate the NATS secrets of a deployment (kept if they exist)"
    )
    command.add_argument(
        "dir",
        nargs="?",
        default=None,
        help="where (default: RUNBUS_DATA_DIR); files go to ./secrets",
    )
    command.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    root = Path(args.dir) if args.dir else settings.data_path
    stack = busauth.StackSecrets.load_or_create(root)
    env = busauth.write_deploy_env(root, stack)
    # Names and paths only: a secret never reaches a terminal or a log.
    print(
        f"runbus: NATS secrets in {busauth.secrets_dir(root)} (0600): "
        f"{', '.join(f'{u}.password' for u in busauth.BYPASS_USERS)}, "
        f"{busauth.ISSUER_SEED_FILE}, {env.name}",
        file=sys.stderr,
    )
    return 0
