"""What several subcommands share: the handler type and a connected client."""

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from nats.aio.client import Client as NATS

from ..runner import connect, resolve_nats_url
from ..settings import Settings

CONNECT_PATIENCE = 5.0
"""Seconds a command waits for NATS before it says it cannot reach it."""

Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]
Subparsers = Any  # argparse's private _SubParsersAction


@asynccontextmanager
async def connected(settings: Settings, name: str = "runbus-cli") -> AsyncIterator[NATS]:
    """A NATS connection to the deployment the settings point at, drained on exit."""
    nc = await connect(resolve_nats_url(settings), name, patience=CONNECT_PATIENCE)
    try:
        yield nc
    finally:
        await nc.drain()
