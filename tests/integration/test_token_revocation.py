"""Revoking a token, as an operator does it and an attacker holding the token sees it: the
token file is replaced under the running services (a new file renamed over the old one), on a
real nats-server with the real auth callout and gateway, and no process is restarted.

- a new connection with a removed token is refused by the callout;
- a run request or API call carrying it, even on a connection opened before, is refused;
- a connection already open loses its NATS user when that user expires
  (`RUNBUS_CLIENT_CREDENTIAL_TTL`), while a connection of a token still in the file outlives
  its user: it reconnects through the callout and carries on;
- a token added works at once, and an edit that cannot be used changes nothing.
"""

import asyncio
import gc
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp
import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from structlog.testing import capture_logs

import runbus.client
from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.errors import RemoteError, Unauthenticated
from runbus.expiring_user import UserExpiredError
from runbus.messages import RunCompleted, RunEvent
from runbus.messages.auth import Identity
from runbus.messages.runs import RunList
from runbus.tokens import TokenVerifier
from runbus_ingress.connections import UserConnections
from runbus_ingress.server import listening
from tests.helpers import TERMINAL, eventually
from tests.stack import SecuredNats, secured_nats, start_stack


@pytest.fixture(autouse=True)
def sockets_of_refused_reconnects_closed() -> Iterator[None]:
    """Closes, after each test, the sockets a refused client's reconnects left open.

    A connection whose token was removed keeps reconnecting and being refused. nats-py opens
    each attempt under `asyncio.wait_for`, which on Python 3.11 can drop a socket that had just
    opened when the attempt is cancelled (the client closed meanwhile). The event loop keeps
    such a socket until it closes, at the end of the session, where its ResourceWarning
    failed the whole run. The peer of each has hung up by now (the test's NATS server is
    gone); a socket some other test still uses has not, and is left alone.
    """
    yield
    for transport in [o for o in gc.get_objects() if isinstance(o, asyncio.Transport)]:
        protocol = transport.get_protocol()
        reader = getattr(protocol, "_stream_reader", None)
        if not transport.is_closing() and reader is not None and reader.at_eof():
            transport.close()


USERS: Final = {"t-alice": ("alice", "acme"), "t-bob": ("bob", "acme")}
RELOADED: Final = 10.0
"""Seconds a test waits for a change of the file to be seen (it takes about one)."""


def token_file(users: dict[str, tuple[str, str]]) -> str:
    return "".join(
        f'[tokens.{token}]\nuser_id = "{user}"\ntenant = "{tenant}"\n'
        for token, (user, tenant) in users.items()
    )


def replace(path: Path, text: str) -> None:
    """The operator's edit: a new file, renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


@dataclass
class Deployment:
    bus: SecuredNats
    tokens: Path
    """The token file the auth service and the gateway both follow."""

    def revoke(self, token: str) -> None:
        replace(self.tokens, token_file({t: u for t, u in USERS.items() if t != token}))

    @asynccontextmanager
    async def service(self) -> AsyncIterator[NATS]:
        """A connection with the service credential (it reads any run's events)."""
        nc = await nats.connect(self.bus.url)
        try:
            yield nc
        finally:
            await nc.drain()

    @asynccontextmanager
    async def client(self, token: str, **options: object) -> AsyncIterator[RunbusClient]:
        async with runbus.client.connect(self.bus.client_url, token=token, **options) as client:
            yield client

    async def refused_at_connect(self, token: str) -> bool:
        """Whether the callout refuses a new connection with `token` (one that is let in is
        closed again)."""
        try:
            nc = await runbus.client.open_connection(self.bus.client_url, token, patience=10)
        except Unauthenticated:
            return True
        await nc.close()
        return False


@asynccontextmanager
async def deployed(
    tmp_path: Path, *, credential_ttl: float | None = None
) -> AsyncIterator[Deployment]:
    """The bus with its callout and the six services, the callout and the gateway each
    following the same token file, as two processes would."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(token_file(USERS))
    async with (
        secured_nats(
            tmp_path / "bus", TokenVerifier.from_file(tokens), credential_ttl=credential_ttl
        ) as bus,
        start_stack(
            bus.url,
            data_dir=tmp_path / "data",
            gateway_options={"verifier": TokenVerifier.from_file(tokens)},
        ),
    ):
        yield Deployment(bus=bus, tokens=tokens)


async def served_call(client: RunbusClient) -> bool:
    return await refused_call(client) == ""


async def refused_call(client: RunbusClient) -> str:
    """The code the gateway answers a client-API call with, or "" when it serves it."""
    try:
        await client.call(ops.API_RUNS_LIST, RunList())
    except RemoteError as exc:
        return exc.remote_code
    return ""


async def whoami(client: RunbusClient) -> Identity:
    """Asked afresh of the auth service (the SDK keeps the first answer)."""
    return await RunbusClient(client.nc, token=client.token).identity()


async def started_run(service: NATS, client: RunbusClient, run_id: str) -> list[tuple[str, str]]:
    """Each event of a run `client` starts, as (type, error code), up to the final one, read
    with the service credential wherever the gateway publishes it (a refused request has no
    owner's subject)."""
    subscription = await service.subscribe(f"runbus.events.*.*.{run_id}")
    try:
        await client.start("travel", "Weather in Sydney?", session_id="s-revoked", run_id=run_id)
        events: list[tuple[str, str]] = []
        while not events or events[-1][0] not in TERMINAL:
            event = msgspec.json.decode((await subscription.next_msg(timeout=20)).data)
            events.append((event["type"], event.get("error", {}).get("code", "")))
        return events
    finally:
        await subscription.unsubscribe()


async def test_a_removed_token_is_refused_at_connect_and_on_a_connection_opened_before(
    tmp_path: Path,
) -> None:
    async with (
        deployed(tmp_path) as deployment,
        deployment.service() as service,
        deployment.client("t-bob") as bob,
        deployment.client("t-alice") as alice,
    ):
        before = await bob.run("travel", "Weather in Perth?", session_id="s1")
        assert isinstance(before, RunCompleted)

        deployment.revoke("t-bob")

        # (a) the callout refuses a new connection.
        await eventually(lambda: deployment.refused_at_connect("t-bob"), RELOADED, interval=0.2)
        # (b) the gateway refuses an API call on the connection bob opened before, and then a
        # run request on it (same verifier), before the run is started or stored.
        assert await eventually(lambda: refused_call(bob), RELOADED, interval=0.2) == (
            "unauthenticated"
        )
        assert bob.nc.is_connected  # still its NATS user: that ends with its lifetime
        assert await started_run(service, bob, "r-revoked") == [("run.failed", "unauthenticated")]
        # whoami, the auth service's own endpoint, refuses it too.
        with pytest.raises(RemoteError) as refused:
            await whoami(bob)
        assert refused.value.remote_code == "unauthenticated"
        # Nobody else is locked out.
        after = await alice.run("travel", "Weather in Perth?", session_id="s2")
        assert isinstance(after, RunCompleted)
        assert not await deployment.refused_at_connect("t-alice")


class ConnectionEvents:
    """What one client's connection went through, as its callbacks say it."""

    def __init__(self) -> None:
        self.errors: list[Exception] = []
        self.expired = asyncio.Event()
        self.refused = asyncio.Event()
        self.reconnected = asyncio.Event()

    async def on_error(self, error: Exception) -> None:
        self.errors.append(error)
        if isinstance(error, UserExpiredError):
            self.expired.set()
        elif self.expired.is_set() and "authorization violation" in str(error).lower():
            self.refused.set()

    async def on_reconnected(self) -> None:
        self.reconnected.set()

    @property
    def options(self) -> dict[str, object]:
        return {"error_cb": self.on_error, "reconnected_cb": self.on_reconnected}


TTL: Final = 2
"""Seconds a NATS user lives in the tests of its expiry (a JWT's expiry is in whole seconds:
the user lives from TTL to TTL + 1)."""
SCHEDULING: Final = 2.0
"""Seconds of slack on a loaded machine for the server's disconnect and the client's
reconnect after an expiry."""


async def test_an_open_connection_of_a_removed_token_loses_its_nats_user_when_it_expires(
    tmp_path: Path,
) -> None:
    bob_sees = ConnectionEvents()
    async with (
        deployed(tmp_path, credential_ttl=TTL) as deployment,
        deployment.client("t-bob", **bob_sees.options) as bob,
    ):
        deployment.revoke("t-bob")
        await eventually(lambda: deployment.refused_at_connect("t-bob"), RELOADED, interval=0.2)

        # From the moment the callout refuses the token, the user bob holds (issued before,
        # or at a reconnect just before that) ends within its lifetime; the server drops the
        # connection and the reconnect through the callout is refused.
        await asyncio.wait_for(bob_sees.refused.wait(), TTL + 1 + SCHEDULING)

        assert not bob.nc.is_connected
        assert isinstance(bob_sees.errors[0], UserExpiredError)


async def test_a_connection_of_a_token_still_in_the_file_outlives_its_nats_user(
    tmp_path: Path,
) -> None:
    alice_sees = ConnectionEvents()
    async with (
        deployed(tmp_path, credential_ttl=TTL) as deployment,
        deployment.service() as service,
        deployment.client("t-alice", **alice_sees.options) as alice,
    ):
        # A follower opened before the expiry (its consumer and subscription) keeps working.
        follower = asyncio.create_task(final_event(alice, "r-followed"))
        await eventually(lambda: events_consumers(service), RELOADED)
        assert not alice_sees.expired.is_set()
        deployment.revoke("t-bob")  # someone else's token: no effect on alice
        await asyncio.wait_for(alice_sees.reconnected.wait(), TTL + 1 + SCHEDULING)

        assert alice_sees.expired.is_set()
        assert not alice_sees.refused.is_set()
        assert alice.nc.is_connected
        assert await refused_call(alice) == ""
        assert isinstance(await alice.run("travel", "Weather?", session_id="s1"), RunCompleted)
        await alice.start("travel", "Weather in Perth?", session_id="s2", run_id="r-followed")
        assert isinstance(await asyncio.wait_for(follower, 30), RunCompleted)


async def events_consumers(service: NATS) -> int:
    info = await service.jetstream().stream_info(subjects.EVENTS_STREAM)
    return info.state.consumer_count


async def final_event(client: RunbusClient, run_id: str) -> RunEvent:
    last: RunEvent | None = None
    async for item in client.follow(run_id, timeout=30):
        last = item.event
    assert last is not None
    return last


async def test_a_token_added_to_the_file_works_without_a_restart(tmp_path: Path) -> None:
    async with deployed(tmp_path) as deployment:
        assert await deployment.refused_at_connect("t-dana")

        replace(deployment.tokens, token_file({**USERS, "t-dana": ("dana", "initech")}))

        await eventually(
            lambda: not_refused_at_connect(deployment, "t-dana"), RELOADED, interval=0.2
        )
        async with deployment.client("t-dana") as dana:
            await eventually(lambda: served_call(dana), RELOADED, interval=0.2)
            done = await dana.run("travel", "Weather in Perth?", session_id="s1")
            me = await dana.identity()

    assert isinstance(done, RunCompleted)
    assert (me.tenant, me.user_id) == ("initech", "dana")


async def not_refused_at_connect(deployment: Deployment, token: str) -> bool:
    return not await deployment.refused_at_connect(token)


async def test_an_edit_that_cannot_be_used_keeps_the_last_tokens_and_the_services_up(
    tmp_path: Path,
) -> None:
    async with deployed(tmp_path) as deployment, deployment.client("t-bob") as bob:
        with capture_logs() as logs:
            replace(deployment.tokens, '[tokens.t-alice]\nuser_id = "alice"\ntenant = "a.b"\n')

            async def both_saw_it() -> bool:
                # The gateway (an API call) and the auth service (whoami) each read the file
                # on their next check, and must serve bob with the tokens they had.
                assert await refused_call(bob) == ""
                assert (await whoami(bob)).user_id == "bob"
                failed = [e for e in logs if e["event"] == "token_file_reload_failed"]
                return len(failed) == 2

            await eventually(both_saw_it, RELOADED, interval=0.2)

        assert all(e["log_level"] == "error" for e in logs if "token_file" in e["event"])
        assert not await deployment.refused_at_connect("t-bob")
        assert not await deployment.refused_at_connect("t-alice")
        assert isinstance(await bob.run("travel", "Weather?", session_id="s1"), RunCompleted)

        # The next good version is read again: still following the file.
        deployment.revoke("t-bob")
        await eventually(lambda: deployment.refused_at_connect("t-bob"), RELOADED, interval=0.2)


async def test_over_http_a_removed_token_is_refused_on_its_open_connection_and_after(
    tmp_path: Path,
) -> None:
    async with deployed(tmp_path) as deployment:
        connections = UserConnections(deployment.bus.client_url, idle_timeout=60)
        async with (
            listening(deployment.bus.client_url, "127.0.0.1", 0, connections=connections) as base,
            aiohttp.ClientSession(base, timeout=aiohttp.ClientTimeout(total=30)) as http,
        ):
            bob = {"Authorization": "Bearer t-bob"}

            async def status() -> int:
                async with http.get("/v1/agents", headers=bob) as response:
                    return response.status

            async def refused() -> bool:
                return await status() == 401

            assert await status() == 200
            assert len(connections) == 1  # bob's own bus connection stays open, idle

            deployment.revoke("t-bob")

            # The ingress holds no credential of its own: the gateway refuses the call on
            # bob's open connection, which the ingress then drops, and the callout refuses
            # the next one.
            await eventually(refused, RELOADED, interval=0.2)
            assert len(connections) == 0
            assert await status() == 401
            assert connections.opened == 1


async def test_over_http_a_removed_token_whose_idle_connection_lost_its_user_is_refused_at_once(
    tmp_path: Path,
) -> None:
    async with deployed(tmp_path, credential_ttl=TTL) as deployment:
        connections = UserConnections(deployment.bus.client_url, idle_timeout=60)
        # Far below the bus's request timeout: a request left waiting on a connection without
        # a server fails here instead of answering.
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            listening(deployment.bus.client_url, "127.0.0.1", 0, connections=connections) as base,
            aiohttp.ClientSession(base, timeout=timeout) as http,
        ):
            bob = {"Authorization": "Bearer t-bob"}
            async with http.get("/v1/agents", headers=bob) as response:
                assert response.status == 200

            deployment.revoke("t-bob")
            # Bob asks nothing until his idle connection's user has expired and the callout
            # has refused its reconnect.
            await eventually(
                lambda: connections.connected("t-bob") is False,
                TTL + 1 + SCHEDULING,
                what="bob's connection without a server",
            )
            async with http.get("/v1/agents", headers=bob) as response:
                refused = (response.status, (await response.json())["error"]["code"])

        assert refused == (401, "unauthenticated")
