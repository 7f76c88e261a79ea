"""deploy/nats/auth.conf on a real nats-server (as compose runs it), secrets in its
environment: the services, the auth service and the monitor connect with passwords of their
own; every other connection is turned by the auth callout into one user's identity, which may
run, call the API and read its own events and nothing else. The whole stack runs this way."""

import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import nats
import nats.errors
import nkeys
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

import runbus.client
from runbus import busauth, subjects
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats, nats_server_binary
from runbus.messages import RunCompleted
from runbus.tokens import TokenVerifier, token_digest
from runbus_auth.service import AuthService
from tests.helpers import eventually
from tests.stack import start_stack

AUTH_CONF: Final = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
STACK: Final = busauth.StackSecrets(
    service_password="service-secret",
    auth_password="auth-secret",
    monitor_password="monitor-secret",
    issuer_seed=nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_ACCOUNT),
)
PASSWORDS: Final = {
    "NATS_RUNBUS_SERVICE_PASSWORD": STACK.service_password,
    "NATS_RUNBUS_AUTH_PASSWORD": STACK.auth_password,
    "NATS_RUNBUS_MONITOR_PASSWORD": STACK.monitor_password,
    "NATS_RUNBUS_AUTH_ISSUER": STACK.issuer_public_key,
    "NATS_SYS_PASSWORD": "sys-secret",
}


class ConfiguredNats(EmbeddedNats):
    """nats-server run as compose runs it (deploy/nats/nats-auth.conf: nats.conf and auth.conf),
    from a copy of deploy/nats whose store is `store_dir`, on random ports, its passwords in
    the environment."""

    def __init__(self, store_dir: Path, env: dict[str, str]) -> None:
        super().__init__(store_dir)
        self.env = env

    def start(self, timeout: float = 10.0) -> str:
        configs = self.store_dir.parent / "nats-config"
        shutil.copytree(AUTH_CONF.parent, configs)
        shipped = (configs / "nats.conf").read_text()
        (configs / "nats.conf").write_text(
            re.sub(r"store_dir: /data$", f'store_dir: "{self.store_dir}"', shipped, flags=re.M)
        )
        ports_dir = Path(tempfile.mkdtemp(prefix="runbus-nats-ports-"))
        self._process = subprocess.Popen(
            [
                str(nats_server_binary()),
                "-c", str(configs / "nats-auth.conf"),
                "--addr", "127.0.0.1",
                "--port", "-1",
                "--http_port", "-1",
                "--ports_file_dir", str(ports_dir),
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        return self._wait_for_port(ports_dir, timeout)


def as_user(url: str, user: str) -> str:
    password = PASSWORDS[f"NATS_{user.upper().replace('-', '_')}_PASSWORD"]
    return url.replace("nats://", f"nats://{user}:{password}@", 1)


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[str]:
    """The server with deploy/nats/auth.conf and the auth service answering its callout."""
    server = ConfiguredNats(tmp_path / "jetstream", PASSWORDS)
    server.start()
    nc = await nats.connect(as_user(server.url, busauth.AUTH_USER))
    auth = AuthService(nc, verifier=TokenVerifier.from_file(), issuer_seed=STACK.issuer_seed)
    await auth.start()
    try:
        yield server.url
    finally:
        await auth.stop()
        await nc.drain()
        server.stop()


def test_the_deploy_config_is_the_one_runbus_generates() -> None:
    assert AUTH_CONF.read_text() == busauth.deploy_config()


class Connection:
    """A connection as one user, keeping the errors the server sent it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: NATS | None = None

    async def open(self, url: str, token: str | None = None, inbox_prefix: str = "_INBOX") -> NATS:
        async def on_error(error: Exception) -> None:
            self.errors.append(str(error))

        if token is not None:
            self.nc = await runbus.client.open_connection(url, token, error_cb=on_error)
        else:
            self.nc = await nats.connect(
                url, error_cb=on_error, max_reconnect_attempts=1, inbox_prefix=inbox_prefix
            )
        return self.nc


@pytest.fixture
async def service(secured: str) -> AsyncIterator[NATS]:
    nc = await nats.connect(as_user(secured, "runbus-service"))
    await nc.jetstream().add_stream(
        StreamConfig(name=subjects.RUNS_STREAM, subjects=[subjects.RUNS_ALL])
    )
    yield nc
    await nc.drain()


@pytest.fixture
async def client(secured: str) -> AsyncIterator[Connection]:
    connection = Connection()
    await connection.open(secured, token="dev-alice")
    yield connection
    assert connection.nc is not None
    await connection.nc.drain()


@pytest.mark.parametrize("config", ["auth.conf", "nats-auth.conf"])
def test_nats_server_accepts_the_auth_config(config: str) -> None:
    result = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(AUTH_CONF.parent / config)],
        env=PASSWORDS,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )

    assert result.returncode == 0, result.stderr


def test_nats_server_refuses_the_auth_config_without_its_passwords() -> None:
    result = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(AUTH_CONF)],
        env={},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )

    assert result.returncode != 0
    assert "NATS_RUNBUS_" in result.stderr


async def test_a_client_can_publish_a_run_request_and_jetstream_stores_it(
    service: NATS, client: Connection
) -> None:
    assert client.nc is not None

    ack = await client.nc.jetstream().publish(
        subjects.runs("travel"), b"{}", headers={"Nats-Msg-Id": "r-auth-1"}
    )

    assert ack.stream == subjects.RUNS_STREAM
    assert client.errors == []


def violation(connection: Connection, what: str) -> bool:
    """Whether the server told `connection` of a permissions violation for `what`."""
    return any(f"permissions violation for {what}" in e.lower() for e in connection.errors)


async def test_a_client_cannot_publish_to_an_internal_service_subject(
    service: NATS, client: Connection
) -> None:
    assert client.nc is not None
    received: list[Msg] = []

    async def on_message(msg: Msg) -> None:
        received.append(msg)

    await service.subscribe(subjects.HISTORY_LOAD, cb=on_message)
    await service.flush()

    await client.nc.publish(subjects.HISTORY_LOAD, b'{"type":"history.load"}')
    with pytest.raises(nats.errors.TimeoutError):
        await client.nc.request(subjects.tool_invoke("create_booking"), b"{}", timeout=0.3)
    await client.nc.flush()
    # The server reports the refused publish after handling it: nothing can arrive later.
    await eventually(lambda: violation(client, f'publish to "{subjects.HISTORY_LOAD}"'))

    assert received == []


async def test_a_client_cannot_subscribe_to_internal_subjects_nor_to_its_own_events_subject(
    service: NATS, client: Connection
) -> None:
    """Its events reach it through a consumer delivering into its inbox: a reply another
    client steers onto the events subject (NATS cannot refuse one) finds nobody there."""
    assert client.nc is not None
    own = subjects.client_inbox_prefix(token_digest("dev-alice"))
    refused = (subjects.events("acme", "alice", "r-auth-2"), subjects.HISTORY_LOG_ALL)
    inbox = await client.nc.subscribe(f"{own}.>")
    for subject in refused:
        await client.nc.subscribe(subject)
    await client.nc.flush()
    await eventually(
        lambda: all(violation(client, f'subscription to "{subject}"') for subject in refused)
    )

    await service.publish(f"{own}.x", b"{}")

    assert (await inbox.next_msg(timeout=2)).data == b"{}"


async def test_the_stack_runs_as_the_service_user_for_a_client_user(
    secured: str, tmp_path: Path
) -> None:
    async with start_stack(as_user(secured, "runbus-service"), data_dir=tmp_path / "data"):
        connection = Connection()
        nc = await connection.open(secured, token="dev-alice")
        try:
            completed = await RunbusClient(nc, token="dev-alice").run(
                "travel", "Weather in Hobart?", session_id="s-auth"
            )
        finally:
            await nc.drain()

    assert isinstance(completed, RunCompleted)
    assert "Hobart" in completed.text
    assert connection.errors == []


async def test_the_monitor_user_discovers_services_and_may_not_touch_runs(
    secured: str, tmp_path: Path
) -> None:
    async with start_stack(as_user(secured, "runbus-service"), data_dir=tmp_path / "data"):
        connection = Connection()
        # Its replies come on the services' inbox prefix, as `runbus status` asks them.
        nc = await connection.open(
            as_user(secured, "runbus-monitor"), inbox_prefix=subjects.SERVICE_INBOX_PREFIX
        )
        try:
            pong = await nc.request("$SRV.PING.history", b"", timeout=2)
            await nc.publish(subjects.runs("travel"), b"{}")
            await nc.flush()
            await eventually(
                lambda: violation(connection, f'publish to "{subjects.runs("travel")}"')
            )
        finally:
            await nc.drain()

    assert b'"name":"history"' in pong.data.replace(b" ", b"")
    assert any(
        f'permissions violation for publish to "{subjects.runs("travel")}"' in error.lower()
        for error in connection.errors
    ), connection.errors
