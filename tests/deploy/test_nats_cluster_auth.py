"""deploy/nats/cluster.conf as compose.cluster.yaml runs it, on three real nats-server processes:
the secrets `runbus secrets` writes (nats.env), each node's shell command from the compose file,
and the config files themselves with only their ports and store moved to a temp dir. Every node
runs the accounts and auth callout of the single server, and a route without the route
password is refused: a cluster config that drops either fails here."""

import asyncio
import re
import socket
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

import nats
import pytest
import yaml
from nats.aio.client import Client as NATS

from runbus import busauth, subjects
from runbus.client import open_connection
from runbus.embedded import nats_server_binary
from runbus.tokens import TokenVerifier, token_digest
from runbus_auth.service import AuthService
from tests.helpers import eventually, refused_raw

ROOT: Final = Path(__file__).resolve().parents[2]
NATS_CONFIGS: Final = ROOT / "deploy" / "nats"
COMPOSE_CLUSTER: Final = ROOT / "compose.cluster.yaml"
NODES: Final = 3

# Three nats-server processes electing a JetStream leader.
slow: Final = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def moved(text: str, pattern: str, value: str) -> str:
    """`text` with the one match of `pattern` replaced: a config whose shape changed fails
    here instead of running with the compose values."""
    result, count = re.subn(pattern, value, text, flags=re.MULTILINE)
    assert count == 1, f"{pattern!r} matched {count} times"
    return result


def node_command(route_ports: list[int], config: Path) -> str:
    """The shell command compose.cluster.yaml gives a node (compose turns `$$` into `$`), with
    the nodes' route addresses on loopback and the config and binary where they are here."""
    (compose_command,) = yaml.safe_load(COMPOSE_CLUSTER.read_text())["x-nats-node"]["command"]
    command = str(compose_command).replace("$$", "$")
    for index, port in enumerate(route_ports):
        command = command.replace(f"@nats-{index + 1}:6222", f"@127.0.0.1:{port}")
    command = command.replace("/etc/nats/cluster.conf", str(config))
    return command.replace("exec nats-server ", f"exec {nats_server_binary()} ")


@dataclass
class DeployedNode:
    process: subprocess.Popen[bytes]
    client_port: int
    http_port: int
    route_port: int

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    def healthy(self) -> bool:
        """200 once the node serves JetStream with a meta leader, which takes routes."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz") as answer:
                return bool(answer.status == 200)
        except OSError:
            return False


@dataclass
class DeployedCluster:
    nodes: list[DeployedNode]
    env: dict[str, str]
    root: Path


START_ATTEMPTS: Final = 3
"""A port picked free can be taken by another process before its node binds it (the node then
exits): the cluster is started again on new ports, this often at most."""


def start_nodes(root: Path, env: dict[str, str]) -> list[DeployedNode]:
    """The three nodes, each with its config under `root`, on ports picked now."""
    route_ports = [free_port() for _ in range(NODES)]
    nodes: list[DeployedNode] = []
    try:
        for index in range(NODES):
            folder = root / f"nats-{index + 1}"
            folder.mkdir(parents=True)
            (folder / "auth.conf").write_text((NATS_CONFIGS / "auth.conf").read_text())
            client_port, http_port = free_port(), free_port()
            text = (NATS_CONFIGS / "cluster.conf").read_text()
            text = moved(text, r"^port: 4222$", f"port: {client_port}")
            text = moved(text, r"^http_port: 8222$", f"http_port: {http_port}")
            text = moved(text, r"^  port: 6222$", f"  port: {route_ports[index]}")
            text = moved(text, r"store_dir: /data$", f'store_dir: "{folder / "data"}"')
            (folder / "cluster.conf").write_text(text)
            with (folder / "nats.log").open("wb") as log:  # the child keeps its own copy
                process = subprocess.Popen(
                    ["/bin/sh", "-c", node_command(route_ports, folder / "cluster.conf")],
                    env={**env, "NATS_SERVER_NAME": f"nats-{index + 1}"},
                    stdout=log,
                    stderr=log,
                )
            nodes.append(DeployedNode(process, client_port, http_port, route_ports[index]))
    except BaseException:
        stop_nodes(nodes)
        raise
    return nodes


def settled(nodes: list[DeployedNode]) -> bool:
    """Every node healthy, or one gone (it could not bind its ports)."""
    return any(n.process.poll() is not None for n in nodes) or all(n.healthy() for n in nodes)


def stop_nodes(nodes: list[DeployedNode]) -> None:
    for node in nodes:
        node.process.terminate()
    for node in nodes:
        node.process.wait(timeout=10)


@pytest.fixture
async def deployed(tmp_path: Path) -> AsyncIterator[DeployedCluster]:
    """The three nodes once every one is healthy (it serves JetStream with a meta leader)."""
    stack = busauth.StackSecrets.load_or_create(tmp_path / "compose")
    env = read_env(busauth.write_deploy_env(tmp_path / "compose", stack))
    for attempt in range(1, START_ATTEMPTS + 1):
        nodes = start_nodes(tmp_path / f"start-{attempt}", env)
        try:
            await eventually(partial(settled, nodes), 30, what="every node healthy, or one gone")
        except BaseException:
            stop_nodes(nodes)
            raise
        if all(n.process.poll() is None for n in nodes):
            break
        stop_nodes(nodes)
        if attempt == START_ATTEMPTS:
            pytest.fail(f"a node exited at start {START_ATTEMPTS} times (see {tmp_path})")
    try:
        yield DeployedCluster(nodes=nodes, env=env, root=tmp_path)
    finally:
        stop_nodes(nodes)


@pytest.fixture
async def answered(deployed: DeployedCluster) -> AsyncIterator[DeployedCluster]:
    """The cluster with the auth service answering on node 1."""
    nc = await nats.connect(
        deployed.nodes[0].url,
        user=busauth.AUTH_USER,
        password=deployed.env["NATS_RUNBUS_AUTH_PASSWORD"],
        inbox_prefix=subjects.SERVICE_INBOX_PREFIX,
    )
    seed = (deployed.root / "compose" / "secrets" / busauth.ISSUER_SEED_FILE).read_bytes()
    auth = AuthService(nc, verifier=TokenVerifier.from_file(), issuer_seed=seed.strip())
    await auth.start()
    try:
        yield deployed
    finally:
        await auth.stop()
        await nc.drain()


@slow
async def test_every_node_refuses_a_connection_without_a_good_credential(
    answered: DeployedCluster,
) -> None:
    for node in answered.nodes:
        assert "Authorization Violation" in await refused_raw(node.url)
        assert "Authorization Violation" in await refused_raw(node.url, token="dev-mallory")
        guess = {"user": busauth.SERVICE_USER, "password": "guess"}
        assert "Authorization Violation" in await refused_raw(node.url, **guess)


async def check_accounts_on(node: DeployedNode, env: dict[str, str]) -> None:
    """The service user has the services' account on `node`; a token, only its subjects."""
    service: NATS = await nats.connect(
        node.url, user=busauth.SERVICE_USER, password=env["NATS_RUNBUS_SERVICE_PASSWORD"]
    )
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error).lower())

    def refused(subject: str) -> bool:
        return any(f'subscription to "{subject}"' in error for error in errors)

    alice = await open_connection(node.url, "dev-alice", error_cb=on_error)
    try:
        # The services' account has JetStream; the token's account is the clients'.
        assert (await service.jetstream().account_info()).limits is not None
        # Only under its own inbox: its live events come through a consumer delivering there.
        own = f"{subjects.client_inbox_prefix(token_digest('dev-alice'))}.>"
        await alice.subscribe(own)
        await alice.subscribe(subjects.EVENTS_ALL)
        await alice.flush()
        await eventually(
            lambda: refused(subjects.EVENTS_ALL), what="alice's subscription to every event"
        )
    finally:
        await alice.close()
        await service.close()
    assert not refused(own)


@slow
async def test_on_every_node_the_services_have_their_account_and_a_token_only_its_subjects(
    answered: DeployedCluster,
) -> None:
    for node in answered.nodes:
        await check_accounts_on(node, answered.env)


@slow
async def test_a_node_without_the_route_password_is_refused_as_a_route(
    deployed: DeployedCluster, tmp_path: Path
) -> None:
    log = tmp_path / "rogue.log"
    rogue = await asyncio.create_subprocess_exec(
        str(nats_server_binary()),
        "--addr", "127.0.0.1",
        "--port", "-1",
        "--cluster_name", "runbus",
        "--cluster", f"nats://127.0.0.1:{free_port()}",
        "--routes", f"nats-route://127.0.0.1:{deployed.nodes[0].route_port}",
        "--log", str(log),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # The refusal is a line of the rogue's log; no event tells another process.
        await eventually(
            lambda: log.exists() and "Authorization Violation" in log.read_text(),
            20,
            what="the rogue route refused",
        )
    finally:
        rogue.terminate()
        await rogue.wait()


@pytest.mark.parametrize("password", ["-a1", "1-2", "true", "generated"])
def test_a_generated_password_is_one_nats_server_reads_from_the_environment_as_it_is(
    password: str, tmp_path: Path
) -> None:
    # nats-server parses a variable's value as configuration: only the generated form is
    # always a plain string (the others are refused, or read as a date or a boolean).
    if password == "generated":
        password = busauth.new_password()
    config = tmp_path / "password.conf"
    config.write_text("authorization { user: someone, password: $PASSWORD }\n")
    result = subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(config)],
        env={"PASSWORD": password},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )

    assert (result.returncode == 0) == password.startswith("rb"), result.stderr
