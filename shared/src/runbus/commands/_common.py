"""What several subcommands share: the handler type, where the stack is, a connected client."""

import argparse
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS

from .. import busauth
from ..client import open_connection
from ..errors import Unavailable
from ..runner import URL_FILE, connect, process_credentials, redact_url
from ..settings import Settings

CONNECT_PATIENCE = 5.0
"""Seconds a command waits for NATS before it says it cannot reach it."""

Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]
Subparsers = Any  # argparse's private _SubParsersAction


class StackNotRunning(Unavailable):
    """No stack to talk to: RUNBUS_NATS_URL is unset and `runbus up` recorded none, or the
    recorded one does not answer."""


def stack_url(settings: Settings) -> str:
    """RUNBUS_NATS_URL, else the embedded server `runbus up` recorded. Never a guess: a
    command must not quietly talk to whatever listens on localhost:4222."""
    if settings.nats_url:
        return settings.nats_url
    recorded = Path(settings.data_dir) / URL_FILE
    if recorded.exists():
        return recorded.read_text().strip()
    raise StackNotRunning(
        f"no runbus stack is running here ({recorded} does not exist and RUNBUS_NATS_URL is "
        "unset); start one with `runbus up` in another terminal, or set RUNBUS_NATS_URL"
    )


async def connect_to_stack(
    settings: Settings, name: str = "runbus-cli", *, operator: bool = False
) -> NATS:
    """As the user of `settings.token` (a token the bus refuses is one line saying so), or,
    for an `operator` command that reads across tenants, with the services' credential
    (RUNBUS_NATS_USER, else the one `runbus up` generated under the data dir)."""
    url = stack_url(settings)
    try:
        if operator:
            credentials = process_credentials(settings, busauth.SERVICE_USER)
            return await connect(url, name, patience=CONNECT_PATIENCE, credentials=credentials)
        return await open_connection(
            url,
            settings.token,
            name=name,
            patience=CONNECT_PATIENCE,
            # As long as a command waits for NATS at start, it waits for it to come back.
            max_reconnect_attempts=max(1, int(CONNECT_PATIENCE / 0.5)),
            reconnect_time_wait=0.5,
            connect_timeout=5,
        )
    except Unavailable:
        if settings.nats_url:
            raise
        raise StackNotRunning(
            f"the stack recorded in {Path(settings.data_dir) / URL_FILE} "
            f"({redact_url(url)}) does not answer: it is not running any more; start it with "
            "`runbus up`"
        ) from None


@asynccontextmanager
async def connected(
    settings: Settings, name: str = "runbus-cli", *, operator: bool = False
) -> AsyncIterator[NATS]:
    """A NATS connection to the deployment the settings point at, drained on exit."""
    nc = await connect_to_stack(settings, name, operator=operator)
    try:
        yield nc
    finally:
        # A connection NATS dropped, or one already closing, has nothing left to drain.
        with contextlib.suppress(nats.errors.Error, OSError, RuntimeError):
            if nc.is_connected:
                await nc.drain()
            else:
                await nc.close()
