"""The client connection of a user the auth callout issued: that user expires
(`RUNBUS_CLIENT_CREDENTIAL_TTL`), and the connection then reconnects instead of closing.

nats-server ends an expired user with `-ERR 'User Authentication Expired'` and closes the
socket. nats.go and the other official clients reconnect on it; nats-py (2.16) closes the
connection for good on every `-ERR` but a stale connection (nats-io/nats.py#1019), so every
SDK client, `runbus chat` and each of the ingress's per-user connections would die once per
TTL. Reconnecting goes through the callout again: a token still in the token file gets a new
user within milliseconds (subscriptions are restored, publishes meanwhile are buffered), and a
removed one is refused, so the connection stays without a user until nats-py's reconnect
attempts run out and it closes.
"""

from typing import Final

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.client import Srv

USER_EXPIRED: Final = "user authentication expired"
"""How nats-server's error says it, lower-cased."""


class UserExpiredError(nats.errors.Error):
    """The server ended the connection's user (its JWT expired); a reconnect follows."""

    def __str__(self) -> str:
        return "nats: user authentication expired"


class ExpiringUserConnection(NATS):
    """A nats-py client that treats its user's expiry as a lost connection: it reconnects
    (through the auth callout) and tells its error callback, where nats-py would close; and
    closes the socket of each reconnect attempt that failed."""

    async def _connect_to_server(self, s: Srv) -> None:
        # nats-py opens each reconnect attempt's socket on the same transport object and
        # drops the previous attempt's socket unclosed: every refused attempt (a removed
        # token's: by default every 2 s, 60 times) would leave a socket to the garbage
        # collector, which warns of each one it finds.
        if self._transport is not None:
            self._transport.close()  # type: ignore[no-untyped-call]
        await super()._connect_to_server(s)

    async def _process_err(self, err_msg: str) -> None:
        if USER_EXPIRED not in err_msg.lower():
            await super()._process_err(err_msg)
            return
        # As a broken socket is handled: reconnect with the same options (or close, when
        # reconnecting is off); the socket the server is closing is dropped on the way.
        await self._process_op_err(UserExpiredError())
        await self._error_cb(UserExpiredError())
