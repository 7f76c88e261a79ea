"""`runbus up`: an embedded NATS (unless RUNBUS_NATS_URL is set) and the seven services as
separate processes, their logs multiplexed into JSON files, started by progress (slow is fine,
stuck is not), all stopped on a failed start, Ctrl-C or SIGTERM."""

import asyncio
import contextlib
import importlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import msgspec
import nats
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from . import busauth, discovery, subjects
from .embedded import DataDirLock, EmbeddedNats
from .logs import read_lines
from .messages.progress import SERVICE_PROGRESS_DECODER, ServiceProgress
from .runner import URL_FILE, process_credentials, redact_url
from .settings import Settings

SERVICES: Final = (
    "auth",
    "history",
    "memory",
    "compaction",
    "model_router",
    "tool_executor",
    "gateway",
)
OPEN_BUS_WARNING: Final = (
    "runbus: WARNING: open bus (--open-bus): NATS has no authentication; any local process "
    "can act as any user and call internal subjects. For hacking only."
)
DEFAULT_PORT: Final = 4222
STALL_AFTER: Final = 60.0
"""Seconds a starting process may show no progress (no new step, no retry, no log line, and
before its first report no CPU time used) before it counts as stuck."""
MAX_LINE: Final = 1 << 20
"""Bytes of one output line kept in a log file; services cut their own fields far below."""
ECHO_LINE: Final = 4096
"""Bytes of one line echoed to the terminal."""
PING_EVERY: Final = 0.5
"""Seconds between `$SRV.PING` checks, for services whose progress reports cannot reach us."""

ProgressCallback = Callable[["Replica", ServiceProgress], None]


class StackError(RuntimeError):
    """The stack could not start: a service exited, stalled, or was not ready in time."""


class ServiceExited(StackError):
    def __init__(self, label: str, code: int, step: str, error: str, log: Path) -> None:
        said = f": {error}" if error else ""
        super().__init__(
            f"{label} exited with code {code} while {step!r}{said}; see {log} "
            "(everything started was stopped)"
        )
        self.label = label
        self.code = code
        self.step = step


class ServiceStalled(StackError):
    def __init__(self, label: str, step: str, reason: str, silent: float, log: Path) -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"{label} stalled: no progress for {silent:.0f} s at step {step!r}{why}; see {log} "
            "(everything started was stopped)"
        )
        self.label = label
        self.step = step


class StackAlreadyRunning(StackError):
    def __init__(self, data_dir: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "its pid not written yet"
        super().__init__(
            f"a stack is already running here ({data_dir}), {holder}; use that one, stop it "
            "(Ctrl-C in its terminal), or give this one its own RUNBUS_DATA_DIR (nothing was "
            "started or changed)"
        )
        self.data_dir = data_dir
        self.pid = pid


class StartTimedOut(StackError):
    def __init__(self, timeout: float, waiting: list[str]) -> None:
        super().__init__(
            f"not ready after {timeout:g} s (--timeout): {'; '.join(waiting)} "
            "(everything started was stopped)"
        )
        self.waiting = waiting


@dataclass
class Replica:
    """One service process and how far its start has got."""

    label: str
    process: asyncio.subprocess.Process
    log: Path
    state: str = "launching"
    step: str = "launching"
    reason: str = ""
    attempt: int = 0
    reported: bool = False
    spawned_at: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    cpu: int | None = None
    error: str = ""
    """The `service_start_failed` error it logged, if it did."""
    last_output: str = ""
    """Its last line of unstructured output (a traceback's last line, when it crashed)."""
    pump: "asyncio.Task[None] | None" = None
    """The reader of its output."""

    @property
    def service(self) -> str:
        return self.label.split("#")[0]

    def describe(self) -> str:
        if self.state == "waiting":
            return f"{self.label} (waiting: {self.reason}, try {self.attempt})"
        return f"{self.label} (at {self.step!r})"


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cpu_ticks(pid: int) -> int | None:
    """User + system CPU ticks of `pid` (Linux), to see an importing process is working."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[11]) + int(fields[12])


def warm_memory_env(
    environ: Mapping[str, str], replicas: Mapping[str, int] | None = None
) -> dict[str, dict[str, str]]:
    """Per memory replica label, RUNBUS_EMBEDDER_WARM=true unless `environ` sets it: where a
    person waits on the first search (`runbus up`, `runbus demo`), the model loads at start."""
    if "RUNBUS_EMBEDDER_WARM" in environ:
        return {}
    count = (replicas or {}).get("memory", 1)
    labels = ["memory", *(f"memory#{n}" for n in range(2, count + 1))]
    return {label: {"RUNBUS_EMBEDDER_WARM": "true"} for label in labels}


def examples_env(environ: Mapping[str, str]) -> dict[str, str]:
    """With the examples package installed (a development checkout, never a production image),
    the settings that serve its agents, tools and models, for each one `environ` leaves unset:
    `runbus up` and `runbus demo` then behave as the demo expects."""
    try:
        examples = importlib.import_module("runbus_examples")
    except ImportError:
        return {}
    found: dict[str, str] = examples.settings_env(environ)
    return found


class ProcessStack:
    def __init__(
        self,
        settings: Settings,
        *,
        services: tuple[str, ...] = SERVICES,
        replicas: dict[str, int] | None = None,
        echo: TextIO | None = None,
        nats_port: int | None = None,
        replica_env: dict[str, dict[str, str]] | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.settings = settings
        self.services = services
        self.replicas = replicas or {}
        self.echo = echo
        self.nats_port = nats_port
        """Embedded server port: None = 4222 if free (easy to find by hand), 0 = any."""
        self.data = Path(settings.data_dir)
        self.url = settings.nats_url or ""
        self.replica_env = replica_env or {}
        """Extra environment of one replica by label (`memory#2`), e.g. its own data dir."""
        self.on_progress = on_progress
        """Called with (replica, report) whenever a starting process reports a new step."""
        self._lock = DataDirLock(self.data)
        self._nats: EmbeddedNats | None = None
        self._nc: NATS | None = None
        self._env: dict[str, str] = {}
        self._identity_env: dict[str, dict[str, str]] = {}
        """Per kind of process (`auth`, `service`): the credential files it connects with."""
        self._processes: list[tuple[str, asyncio.subprocess.Process]] = []
        self._replicas: dict[str, Replica] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self.spawned: list[int] = []
        """Pid of every process started, stopped or not (none may outlive `stop`)."""
        self._changed = asyncio.Event()
        self._pretty = echo is not None and echo.isatty()

    async def start(self, timeout: float | None = None, stall_after: float = STALL_AFTER) -> str:
        """Start NATS (unless one is configured) and every replica; return once all are ready.

        Waits as long as they make progress; raises `StackError` when one exits, shows no
        progress for `stall_after` seconds, or (with `timeout`) is not ready by then. Whatever
        it started is stopped before it raises, also when it is cancelled. Another stack
        running on the same data dir is `StackAlreadyRunning`, raised before anything is
        touched.
        """
        if not self._lock.acquire():
            raise StackAlreadyRunning(self.data, self._lock.holder())
        try:
            (self.data / "logs").mkdir(parents=True, exist_ok=True)
            if not self.url:
                config = None
                if self.settings.open_bus:
                    print(OPEN_BUS_WARNING, file=self.echo or sys.stderr, flush=True)
                else:
                    secrets = busauth.StackSecrets.load_or_create(self.data)
                    config = busauth.write_server_config(self.data, secrets)
                    self._identity_env = self._credential_env()
                self._nats = EmbeddedNats(
                    self.data / "jetstream",
                    port=self._port(),
                    log_file=self.data / "logs" / "nats.log",
                    config_file=config,
                    own_session=True,
                )
                self.url = self._nats.start()
                (self.data / URL_FILE).write_text(self.url)
            await self._listen()
            # Files are JSON lines whatever the terminal: `runbus logs` reads them.
            self._env = {
                **os.environ,
                **examples_env(os.environ),
                "RUNBUS_NATS_URL": self.url,
                "RUNBUS_DATA_DIR": str(self.data),
                "RUNBUS_LOG_FORMAT": "json",
            }
            labels = []
            for service in self.services:
                for replica in range(self.replicas.get(service, 1)):
                    label = service if replica == 0 else f"{service}#{replica + 1}"
                    await self._spawn(label)
                    labels.append(label)
            await self._wait_ready(labels, timeout, stall_after)
        except BaseException:
            await self.stop()
            raise
        return self.url

    async def _listen(self) -> None:
        async def quiet(_: Exception) -> None:
            pass  # the services say what NATS is doing; this connection only listens

        credentials = process_credentials(self.settings, busauth.SERVICE_USER)
        self._nc = await nats.connect(
            [part.strip() for part in self.url.split(",") if part.strip()],
            name="runbus-supervisor",
            inbox_prefix=subjects.SERVICE_INBOX_PREFIX,
            **(
                {"user": credentials.user, "password": credentials.password}
                if credentials and not busauth.in_url(self.url)
                else {}
            ),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
        )
        await self._nc.subscribe(subjects.PROGRESS_ALL, cb=self._on_report)

    async def _on_report(self, msg: Msg) -> None:
        try:
            report = SERVICE_PROGRESS_DECODER.decode(msg.data)
        except msgspec.DecodeError:
            return
        pid = report.instance.rpartition(":")[2]
        for replica in self._replicas.values():
            if str(replica.process.pid) != pid or replica.service != report.service:
                continue
            key = (report.state, report.step, report.reason, report.attempt)
            if key != (replica.state, replica.step, replica.reason, replica.attempt):
                replica.state, replica.step, replica.reason, replica.attempt = key
                replica.last_progress = time.monotonic()
                if self.on_progress is not None:
                    self.on_progress(replica, report)
            replica.reported = True
            self._changed.set()

    def _credential_env(self) -> dict[str, dict[str, str]]:
        """Paths, never secrets: a replica with a data dir of its own still finds them."""
        folder = busauth.secrets_dir(self.data).resolve()
        return {
            "auth": {
                "RUNBUS_NATS_USER": busauth.AUTH_USER,
                "RUNBUS_NATS_PASSWORD_FILE": str(folder / f"{busauth.AUTH_USER}.password"),
                "RUNBUS_AUTH_ISSUER_SEED_FILE": str(folder / busauth.ISSUER_SEED_FILE),
            },
            "service": {
                "RUNBUS_NATS_USER": busauth.SERVICE_USER,
                "RUNBUS_NATS_PASSWORD_FILE": str(folder / f"{busauth.SERVICE_USER}.password"),
            },
        }

    async def _spawn(self, label: str) -> None:
        service = label.split("#")[0]
        identity = self._identity_env.get("auth" if service == "auth" else "service", {})
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"runbus_{service}",
            env={**self._env, **identity, **self.replica_env.get(label, {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # A Ctrl-C in the terminal reaches `runbus up` alone: a service signalled by the
            # terminal and then by `stop` takes the second signal as "cut the drain short".
            start_new_session=True,
        )
        replica = Replica(label, process, self.data / "logs" / f"{label.replace('#', '-')}.log")
        self._replicas[label] = replica
        self._processes.append((label, process))
        self.spawned.append(process.pid)
        replica.pump = asyncio.create_task(self._pump(replica))
        self._pumps.append(replica.pump)

    @property
    def labels(self) -> list[str]:
        """The running replicas: `gateway`, `gateway#2`, …."""
        return [label for label, _ in self._processes]

    async def kill(self, label: str) -> None:
        """SIGKILL one replica (`gateway`, `gateway#2`): a crash, no drain, nothing flushed."""
        [process] = [p for name, p in self._processes if name == label]
        self._processes.remove((label, process))
        process.kill()
        await process.wait()

    async def restart(
        self, label: str, timeout: float | None = None, stall_after: float = STALL_AFTER
    ) -> None:
        """Start a replica that `kill` stopped again, as a supervisor would, and wait until
        it is ready."""
        await self._spawn(label)
        await self._wait_ready([label], timeout, stall_after)

    def _port(self) -> int:
        if self.nats_port is not None:
            return self.nats_port
        return DEFAULT_PORT if _port_free(DEFAULT_PORT) else 0

    async def _pump(self, replica: Replica) -> None:
        """Copy a child's output to its log file (JSON lines) and the echo, for as long as the
        child writes: a reader that stopped would block the child on a full pipe."""
        assert replica.process.stdout is not None
        with open(replica.log, "ab") as log:
            async for line, cut in read_lines(replica.process.stdout, MAX_LINE):
                replica.last_progress = time.monotonic()
                try:
                    fields = self._write(log, replica, line, cut)
                    self._echo(replica.label, line, fields)
                except Exception as exc:  # a full disk or a closed terminal
                    structlog.get_logger().warning(
                        "log_line_lost", service=replica.label, error=repr(exc)
                    )

    def _write(self, log: Any, replica: Replica, line: bytes, cut: int) -> dict[str, Any] | None:
        fields: dict[str, Any] | None = None
        if line.startswith(b"{") and not cut:
            with contextlib.suppress(msgspec.DecodeError):
                decoded = msgspec.json.decode(line)
                fields = decoded if isinstance(decoded, dict) else None
        if fields is None:
            # Not a structured line (a crash's traceback, a library's print): wrapped, so
            # the file stays JSON lines.
            fields = {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "level": "info",
                "event": "output",
                "service": replica.label,
                "text": line.decode(errors="replace"),
            }
            if cut:
                fields["truncated_bytes"] = cut
            log.write(msgspec.json.encode(fields) + b"\n")
            if fields["text"].strip() and not replica.error:
                # A crash before logging is set up ends with the exception's own line.
                replica.last_output = fields["text"].strip()[:300]
        else:
            log.write(line + b"\n")
            if fields.get("event") == "service_start_failed":
                replica.error = str(fields.get("error", ""))
        log.flush()
        return fields

    def _echo(self, label: str, line: bytes, fields: dict[str, Any] | None) -> None:
        if self.echo is None:
            return
        if self._pretty and fields is not None:
            shown = dict(fields)
            if isinstance(shown.get("exception"), str):
                # The terminal gets the exception's last line; the log file keeps it whole.
                *_, last = shown.pop("exception").strip().splitlines() or [""]
                shown["error"] = shown.get("error") or last
            text = structlog.dev.ConsoleRenderer()(None, "", shown)
        else:
            text = line[:ECHO_LINE].decode(errors="replace")
        self.echo.write(f"{label:>15} | {text}\n")
        self.echo.flush()

    async def _wait_ready(
        self, labels: list[str], timeout: float | None, stall_after: float
    ) -> None:
        """Until every replica in `labels` reported ready (or its service answers
        `$SRV.PING` from all its replicas)."""
        assert self._nc is not None
        began = time.monotonic()
        next_ping = began + PING_EVERY
        waiting = [self._replicas[label] for label in labels]
        while True:
            now = time.monotonic()
            for replica in waiting:
                code = replica.process.returncode
                if code is not None:
                    if replica.pump is not None:  # its last words name what went wrong
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(asyncio.shield(replica.pump), 5)
                    raise ServiceExited(
                        replica.label,
                        code,
                        replica.step,
                        replica.error or replica.last_output,
                        replica.log,
                    )
            if now >= next_ping:
                next_ping = now + PING_EVERY
                await self._ping(waiting)
            # A degraded replica is ready: it serves, without one of its dependencies.
            waiting = [r for r in waiting if r.state not in ("ready", "degraded")]
            if not waiting:
                return
            for replica in waiting:
                if not replica.reported:
                    ticks = _cpu_ticks(replica.process.pid)
                    if ticks is not None and ticks != replica.cpu:
                        replica.cpu = ticks
                        replica.last_progress = now
                if now - replica.last_progress > stall_after:
                    raise ServiceStalled(
                        replica.label,
                        replica.step,
                        replica.reason,
                        now - replica.last_progress,
                        replica.log,
                    )
            if timeout is not None and now - began > timeout:
                raise StartTimedOut(timeout, [replica.describe() for replica in waiting])
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.1)

    async def _ping(self, waiting: list[Replica]) -> None:
        assert self._nc is not None
        for service in {replica.service for replica in waiting}:
            everyone = [r for r in self._replicas.values() if r.service == service]
            live = [r for r in everyone if r.process.returncode is None]
            ready = await discovery.count_ready(self._nc, service, enough=len(live), wait=0.2)
            if ready >= len(live):
                for replica in live:
                    replica.state = "ready"

    def pid(self, label: str) -> int:
        """Process id of the replica `label`."""
        return self._replicas[label].process.pid

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every service (each drains), then stop the embedded NATS."""
        for _, process in self._processes:
            if process.returncode is None:
                process.terminate()
                # A stopped (SIGSTOP, ^Z) process acts on the SIGTERM only once it runs.
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
        for _, process in self._processes:
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                process.kill()
                await process.wait()
        for pump in self._pumps:
            with contextlib.suppress(Exception):
                await pump
        self._pumps.clear()
        self._processes.clear()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
        if self._nats is not None:
            self._nats.stop()
            (self.data / URL_FILE).unlink(missing_ok=True)
            self._nats = None
        self._lock.release()

    @property
    def display_url(self) -> str:
        """The NATS URL without any password in it, for printing."""
        return redact_url(self.url)
