"""The cluster under test: three hosts each running a nats-server node of the shipped
deploy/nats/cluster.conf (with auth.conf beside it, as compose.cluster.yaml mounts them) and
some runbus services as OS processes, a fourth host for the clients, and this test process on
that client host. Only listen addresses, routes and paths differ from a deployment: the nodes
read the shipped files themselves (`-c deploy/nats/cluster.conf -sd <store>`)."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from runbus import busauth, subjects
from runbus.client import RunbusClient, open_connection
from runbus.embedded import nats_server_binary
from runbus.messages.progress import SERVICE_PROGRESS_DECODER
from runbus.supervisor import examples_env
from tests.cluster.network import Host, Network, inside, remove_stale
from tests.helpers import eventually

ROOT: Final = Path(__file__).resolve().parents[2]
CLUSTER_CONF: Final = ROOT / "deploy" / "nats" / "cluster.conf"
AUTH_CONF: Final = ROOT / "deploy" / "nats" / "auth.conf"
NODES: Final = ("n1", "n2", "n3")
CLIENT: Final = "c"
CLIENT_PORT: Final = 4222
ROUTE_PORT: Final = 6222
MONITOR_PORT: Final = 8222
"""The ports cluster.conf sets: each host has its own network, so every node keeps them."""
PLACEMENT: Final = {
    "n1": ("auth", "history", "model_router", "tool_executor", "gateway"),
    "n2": ("auth", "history", "memory", "compaction", "model_router", "tool_executor"),
    "n3": ("auth", "history", "model_router", "tool_executor", "gateway"),
}
"""Services per host: two gateways on different hosts, and on each side of a 2/1 split at
least one replica of everything a run needs (memory and compaction on one host only: the
workload's agents do not need them to finish a run)."""
TENANT, USER, TOKEN = "acme", "alice", "dev-alice"
STREAM_REPLICAS: Final = "3"
"""Replicas of every stream and bucket, as compose.cluster.yaml sets them."""
REQUEST_TIMEOUT: Final = "3"
"""Seconds per hop: a request lost to a fault fails after this and the run retries it."""
RESTARTS: Final = 3
"""Times a process that exits while starting is started again."""
RUN_ACK_WAIT: Final = "6"
"""Seconds before a run whose gateway stopped confirming it goes to the other gateway."""
CLIENT_OPTIONS: Final[dict[str, Any]] = {
    "max_reconnect_attempts": -1,
    "reconnect_time_wait": 0.5,
    # A client behind a dead link notices within seconds, as a real client configured
    # for a cluster should (nats-py's default is two missed pings two minutes apart).
    "ping_interval": 2,
    "max_outstanding_pings": 2,
}

AGENT_TOML = """
name = "{name}"
instructions = "You are a travel assistant."
model = "scripted/{name}"
tools = ["get_weather", "create_booking"]
max_iterations = 6
[memory]
enabled = false
"""
SCRIPTS_TOML = """
[[book]]
text = "weather"
tool_calls = [{name = "get_weather", arguments = {city = "Sydney"}}]
[[book]]
text = "booking"
tool_calls = [{name = "create_booking", arguments = {flight_id = "QF412-20261208"}}]
[[book]]
text = "booked"

[[approve]]
text = "weather"
tool_calls = [{name = "get_weather", arguments = {city = "Perth"}}]
[[approve]]
text = "booking"
tool_calls = [{name = "create_booking", arguments = {flight_id = "QF431-20261208", cabin = "business"}}]
[[approve]]
text = "booked"
"""  # noqa: E501
AGENTS: Final = ("book", "approve")
"""`book`: weather, then an economy booking; `approve`: the same with a business booking,
which waits for a person's approval."""


SHIPPED_STORE: Final = "store_dir: /data"


def node_config(store: Path) -> str:
    """deploy/nats/cluster.conf with its one fixed path (`/data`, a volume in compose) moved
    to `store`, a directory per host kept across a kill and a restart; nothing else differs.
    Addresses and routes come from the environment, as in compose."""
    shipped = CLUSTER_CONF.read_text()
    assert shipped.count(SHIPPED_STORE) == 1, f"{CLUSTER_CONF} no longer says {SHIPPED_STORE!r}"
    return shipped.replace(SHIPPED_STORE, f'store_dir: "{store}"')


@dataclass
class Proc:
    """One OS process on one host (`nats@n1`, `gateway@n3`)."""

    label: str
    host: Host
    command: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def service(self) -> str:
        return self.label.split("@")[0]

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.label} never started"
        return self.process.pid

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            # `ip netns exec` execs the command: this pid is the service's own.
            self.process = subprocess.Popen(
                self.host.exec(*self.command),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, number: signal.Signals) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    async def exited(self, timeout: float) -> None:
        await eventually(lambda: not self.running(), timeout, what=f"{self.label} exited")

    async def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed (a paused process dies too)."""
        self.signal(signal.SIGKILL)
        await self.exited(10)

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM and wait (a SIGKILL when it takes longer than `timeout`)."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            await self.exited(timeout)
        except AssertionError:
            await self.kill()


@dataclass
class Cluster:
    network: Network
    root: Path
    nodes: dict[str, Proc] = field(default_factory=dict)
    services: dict[str, Proc] = field(default_factory=dict)
    observer: NATS | None = None
    """Service credential, every node: reads streams and buckets, hears progress reports."""
    client_nc: NATS | None = None
    client: RunbusClient | None = None
    states: dict[int, str] = field(default_factory=dict)
    """Last progress state each service process reported, by pid."""
    started_in: float = 0.0
    """Seconds from nothing to every node and service ready."""
    start_notes: list[str] = field(default_factory=list)
    """Processes that had to be started again (what a supervisor would have done)."""

    @property
    def secrets_dir(self) -> Path:
        return self.root / "stack"

    def node_url(self, name: str) -> str:
        return f"nats://{self.network.hosts[name].address}:{CLIENT_PORT}"

    @property
    def urls(self) -> list[str]:
        return [self.node_url(name) for name in NODES]

    def secrets(self) -> busauth.StackSecrets:
        return busauth.StackSecrets.load_or_create(self.secrets_dir)

    def service_login(self) -> dict[str, str]:
        return {"user": busauth.SERVICE_USER, "password": self.secrets().service_password}

    # -- nodes ---------------------------------------------------------------------------

    def node_env(self, name: str) -> dict[str, str]:
        secrets = self.secrets()
        deploy = busauth.write_deploy_env(self.secrets_dir, secrets)
        values = dict(line.split("=", 1) for line in deploy.read_text().splitlines() if "=" in line)
        password = values["NATS_ROUTE_PASSWORD"]
        routes = ", ".join(
            f"nats-route://{busauth.ROUTE_USER}:{password}@{self.network.hosts[n].address}"
            f":{ROUTE_PORT}"
            for n in NODES
        )
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **values,
            "NATS_SERVER_NAME": f"nats-{name[1:]}",
            "NATS_ROUTE_URLS": f"[{routes}]",
            "GOMAXPROCS": "1",
        }

    def add_node(self, name: str) -> Proc:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / CLUSTER_CONF.name
        config.write_text(node_config(folder / "jetstream"))
        # auth.conf is included from beside the config: the shipped file itself, linked.
        (folder / AUTH_CONF.name).unlink(missing_ok=True)
        (folder / AUTH_CONF.name).symlink_to(AUTH_CONF)
        command = [str(nats_server_binary()), "-c", str(config)]
        proc = Proc(
            f"nats@{name}",
            self.network.hosts[name],
            command,
            self.node_env(name),
            self.root / "logs" / f"nats-{name}.log",
        )
        self.nodes[name] = proc
        return proc

    async def monitor(self, name: str, path: str) -> tuple[int, bytes]:
        """GET `path` (`/healthz`, `/varz`) of a node's monitoring port: status and body."""
        address = self.network.hosts[name].address
        reader, writer = await asyncio.wait_for(asyncio.open_connection(address, MONITOR_PORT), 2)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), body

    async def node_healthy(self, name: str, timeout: float = 60.0) -> None:
        """Until the node's /healthz says ok (JetStream current with its peers)."""

        async def ok() -> bool:
            status, _ = await self.monitor(name, "/healthz")
            return status == 200

        await eventually(
            ok, timeout, retrying=(OSError, TimeoutError), interval=0.2, what=f"nats@{name} ok"
        )

    async def restart_node(self, name: str) -> None:
        self.nodes[name].start()
        await self.node_healthy(name)

    # -- services ------------------------------------------------------------------------

    def service_env(self, host: str, service: str) -> dict[str, str]:
        folder = busauth.secrets_dir(self.secrets_dir).resolve()
        base = {k: v for k, v in os.environ.items() if not k.startswith("RUNBUS_")}
        identity = (
            {
                "RUNBUS_NATS_USER": busauth.AUTH_USER,
                "RUNBUS_NATS_PASSWORD_FILE": str(folder / f"{busauth.AUTH_USER}.password"),
                "RUNBUS_AUTH_ISSUER_SEED_FILE": str(folder / busauth.ISSUER_SEED_FILE),
            }
            if service == "auth"
            else {
                "RUNBUS_NATS_USER": busauth.SERVICE_USER,
                "RUNBUS_NATS_PASSWORD_FILE": str(folder / f"{busauth.SERVICE_USER}.password"),
            }
        )
        local = self.node_url(host)
        others = [self.node_url(n) for n in NODES if n != host]
        return {
            **base,
            **examples_env({}),
            "RUNBUS_NATS_URL": ",".join([local, *others]),
            "RUNBUS_DATA_DIR": str(self.root / host / "data"),
            "RUNBUS_STREAM_REPLICAS": STREAM_REPLICAS,
            "RUNBUS_AGENTS_DIR": str(self.root / "agents"),
            "RUNBUS_MODEL_SCRIPTS": str(self.root / "scripts.toml"),
            "RUNBUS_TOOL_MODULES": "tests.cluster.booking_tools",
            "RUNBUS_EMBEDDER": "hashing",
            "RUNBUS_LOG_LEVEL": "warning",
            "RUNBUS_LOG_FORMAT": "json",
            "RUNBUS_REQUEST_TIMEOUT": REQUEST_TIMEOUT,
            "RUNBUS_RUN_ACK_WAIT": RUN_ACK_WAIT,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")])),
            **identity,
        }

    def add_service(self, host: str, service: str) -> Proc:
        label = f"{service}@{host}"
        proc = Proc(
            label,
            self.network.hosts[host],
            [sys.executable, "-m", f"runbus_{service}"],
            self.service_env(host, service),
            self.root / "logs" / f"{service}-{host}.log",
        )
        self.services[label] = proc
        return proc

    async def _on_progress(self, msg: Msg) -> None:
        with contextlib.suppress(msgspec.DecodeError, ValueError):
            report = SERVICE_PROGRESS_DECODER.decode(msg.data)
            self.states[int(report.instance.rpartition(":")[2])] = report.state

    async def services_ready(self, procs: list[Proc], timeout: float = 90.0) -> None:
        """Until every process in `procs` reported ready. One that exits while starting is
        started again, as a supervisor (compose, Kubernetes) would, at most `RESTARTS`
        times; each restart is noted."""
        restarts: dict[str, int] = {}

        def ready() -> bool:
            for proc in procs:
                if proc.running():
                    continue
                restarts[proc.label] = restarts.get(proc.label, 0) + 1
                assert restarts[proc.label] <= RESTARTS, f"{proc.label} exited; see {proc.log}"
                self.start_notes.append(f"{proc.label} exited while starting: {last_words(proc)}")
                proc.start()
            return all(self.states.get(p.pid) in ("ready", "degraded") for p in procs)

        await eventually(ready, timeout, interval=0.1, what="services ready")

    async def restart_service(self, label: str) -> None:
        proc = self.services[label]
        proc.start()
        await self.services_ready([proc])

    # -- reading back --------------------------------------------------------------------

    async def connect_observer(self) -> None:
        self.observer = await nats.connect(
            self.urls,
            **self.service_login(),
            inbox_prefix=subjects.SERVICE_INBOX_PREFIX,
            error_cb=_quiet,
            **CLIENT_OPTIONS,
        )
        await self.observer.subscribe(subjects.PROGRESS_ALL, cb=self._on_progress)

    async def connect_client(self) -> None:
        """Alice's connection (her token, through any node's callout)."""
        self.client_nc = await open_connection(
            self.urls, TOKEN, error_cb=_quiet, patience=60, **CLIENT_OPTIONS
        )
        self.client = RunbusClient(self.client_nc, token=TOKEN)

    async def stream_leader(self, stream: str, *, via: str = "", timeout: float = 60.0) -> str:
        """The host (`n2`) whose node leads `stream` now, as the observer's node sees it, or
        node `via` (a node cut off from the majority knows of no leader)."""
        assert self.observer is not None
        nc = self.observer
        if via:
            nc = await nats.connect(
                self.node_url(via), **self.service_login(), error_cb=_quiet, **CLIENT_OPTIONS
            )

        async def leader() -> str:
            info = await nc.jetstream().stream_info(stream)
            name = info.cluster.leader if info.cluster else None
            return f"n{str(name).rpartition('-')[2]}" if name else ""

        try:
            return await eventually(
                leader,
                timeout,
                retrying=(nats.errors.Error, nats.js.errors.Error, TimeoutError),
                what=f"a leader of {stream}" + (f" seen by {via}" if via else ""),
            )
        finally:
            if via:
                await nc.close()

    async def close(self) -> None:
        for procs in (self.services, self.nodes):
            for proc in procs.values():
                proc.signal(signal.SIGCONT)
                proc.signal(signal.SIGKILL)
        for nc in (self.client_nc, self.observer):
            if nc is not None and not nc.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), 5)
        for procs in (self.services, self.nodes):
            for proc in procs.values():
                if proc.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.process.wait(5)


def last_words(proc: Proc) -> str:
    """The `error` of the last JSON line a process logged (why it exited)."""
    for line in reversed(proc.log.read_bytes().splitlines() if proc.log.exists() else []):
        with contextlib.suppress(msgspec.DecodeError):
            fields = msgspec.json.decode(line)
            if isinstance(fields, dict) and "error" in fields:
                return f"{fields.get('step', '')}: {fields['error']}"
    return "no error logged"


async def _quiet(error: Exception) -> None:
    """Faults make connections fail on purpose: expected here, not worth a traceback."""


def write_agents(root: Path) -> None:
    (root / "agents").mkdir(parents=True, exist_ok=True)
    for name in AGENTS:
        (root / "agents" / f"{name}.toml").write_text(AGENT_TOML.format(name=name))
    (root / "scripts.toml").write_text(SCRIPTS_TOML)


@asynccontextmanager
async def running_cluster(root: Path) -> AsyncIterator[Cluster]:
    """Hosts n1..n3 (a node and services each) and c (this process and its clients), up and
    ready; everything removed on the way out, whichever way that is."""
    remove_stale()
    network = Network([*NODES, CLIENT])
    cluster = Cluster(network, root)
    began = time.monotonic()
    try:
        network.create()
        write_agents(root)
        with inside(network.hosts[CLIENT]):
            try:
                for name in NODES:
                    cluster.add_node(name).start()
                for name in NODES:
                    await cluster.node_healthy(name)
                await cluster.connect_observer()
                procs = [
                    cluster.add_service(host, service)
                    for host, services in PLACEMENT.items()
                    for service in services
                ]
                for proc in procs:
                    proc.start()
                await cluster.services_ready(procs)
                await cluster.connect_client()
                cluster.started_in = time.monotonic() - began
                yield cluster
            finally:
                await cluster.close()
    finally:
        network.remove()
