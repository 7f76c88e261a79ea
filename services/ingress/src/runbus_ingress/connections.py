"""One bus connection per user: opened with the user's own token on first use, shared by that
user's requests, closed when idle, bounded in number.

The ingress holds no privileged connection: whatever the bus lets a user's credential do is
what that user can do over HTTP, no more.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import structlog

from runbus.client import RunbusClient, connect
from runbus.errors import RemoteError, RunbusError, Unauthenticated, Unavailable

log = structlog.get_logger()

Connect = Callable[..., AbstractAsyncContextManager[RunbusClient]]
"""`runbus.client.connect`'s shape: `(url, *, token=...)` → a client on its own connection."""

REFUSED_TOKEN: Final = "this token was not accepted: it is unknown or has expired"
MAX_CONNECTIONS: Final = 256
IDLE_TIMEOUT: Final = 120.0


@dataclass
class _Connection:
    client: RunbusClient
    closer: AsyncExitStack
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)


class UserConnections:
    """The per-user connections of one ingress process.

    A request leases its user's connection for as long as it runs (a stream for the whole
    stream); a connection nobody has leased for `idle_timeout` seconds is closed, and when
    `max_connections` are open the least recently used idle one makes room. When every open
    connection is in use the request is refused with `unavailable` (503), never queued.
    """

    def __init__(
        self,
        url: str | list[str],
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        connector: Connect = connect,
    ) -> None:
        self.url = url
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self._connect = connector
        self._open: dict[str, _Connection] = {}
        self._opening: dict[str, asyncio.Task[_Connection]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.opened = 0
        """Connections opened since start (a counter for tests and `/healthz`)."""

    def __len__(self) -> int:
        return len(self._open)

    def connected(self, token: str) -> bool | None:
        """Whether the user's open connection has a server now; None when there is none."""
        connection = self._open.get(token)
        return None if connection is None else connection.client.nc.is_connected

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="ingress-idle-sweeper")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for task in self._opening.values():
            task.cancel()
        await asyncio.gather(*self._opening.values(), return_exceptions=True)
        for token in list(self._open):
            await self._close(token)
        await asyncio.gather(*self._closing, return_exceptions=True)

    @asynccontextmanager
    async def lease(self, token: str) -> AsyncIterator[RunbusClient]:
        """The user's client, held open until the block ends."""
        connection = await self._get(token)
        connection.leases += 1
        try:
            yield connection.client
        except RemoteError as exc:
            if exc.known_code == Unauthenticated.code:
                # A token the bus refuses keeps no connection: the next request tries afresh.
                connection.last_used = 0.0
            raise
        finally:
            connection.leases -= 1
            if connection.last_used:
                connection.last_used = time.monotonic()
            elif connection.leases == 0 and self._open.get(token) is connection:
                await self._close(token)

    async def _get(self, token: str) -> _Connection:
        connection = self._open.get(token)
        if (
            connection is not None
            and connection.leases == 0
            and not connection.client.nc.is_connected
        ):
            # Without a server (its user expired and the callout refuses the token now, or
            # the bus is away): a request would wait out its timeout on it. A new connection
            # answers at once, refused (401) or served.
            self._set_aside(token)
            connection = None
        if connection is not None:
            connection.last_used = time.monotonic()
            return connection
        opening = self._opening.get(token)
        if opening is None:
            self._make_room()
            opening = asyncio.create_task(self._open_connection(token))
            self._opening[token] = opening
            opening.add_done_callback(lambda _: self._opening.pop(token, None))
        return await asyncio.shield(opening)

    async def _open_connection(self, token: str) -> _Connection:
        closer = AsyncExitStack()
        try:
            client = await closer.enter_async_context(self._connect(self.url, token=token))
        except Unauthenticated:
            await closer.aclose()
            # The client library's words are for its own users (which bus, which setting); an
            # HTTP caller — a browser, an OpenAI client — only needs to know the token failed.
            raise Unauthenticated(REFUSED_TOKEN) from None
        except RunbusError:
            await closer.aclose()
            raise
        except Exception as exc:  # the bus refused the credential or is not reachable
            await closer.aclose()
            log.warning("ingress_connect_failed", error=type(exc).__name__)
            raise Unavailable(f"cannot connect to the bus as this user: {exc}") from None
        connection = _Connection(client=client, closer=closer)
        self._open[token] = connection
        self.opened += 1
        return connection

    def _make_room(self) -> None:
        if len(self._open) + len(self._opening) < self.max_connections:
            return
        idle = [(c.last_used, t) for t, c in self._open.items() if c.leases == 0]
        if not idle:
            raise Unavailable(
                f"the ingress has {self.max_connections} users' requests in flight; retry soon"
            )
        _, token = min(idle)
        self._set_aside(token)

    def _set_aside(self, token: str) -> None:
        """Take `token`'s connection out of use, closed beside the request that goes on
        rather than before it."""
        closing = asyncio.create_task(self._shut(self._open.pop(token)))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def _close(self, token: str) -> None:
        connection = self._open.pop(token, None)
        if connection is not None:
            await self._shut(connection)

    @staticmethod
    async def _shut(connection: _Connection) -> None:
        try:
            await connection.closer.aclose()
        except Exception as exc:  # a connection that already broke has nothing to drain
            log.info("ingress_connection_close_failed", error=type(exc).__name__)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(self.idle_timeout / 4, 0.05))
            cutoff = time.monotonic() - self.idle_timeout
            for token, connection in list(self._open.items()):
                if connection.leases == 0 and connection.last_used < cutoff:
                    await self._close(token)
