"""`runbus up`: an embedded NATS (unless RUNBUS_NATS_URL is set) and the six services as
separate processes, their logs multiplexed, all drained on Ctrl-C or SIGTERM."""

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path
from typing import Final, TextIO

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from .embedded import EmbeddedNats
from .runner import URL_FILE
from .settings import Settings

SERVICES: Final = ("history", "memory", "compaction", "model_router", "tool_executor", "gateway")
DEFAULT_PORT: Final = 4222


class StackError(RuntimeError):
    """A service process died or did not answer its discovery ping in time."""


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _responders(nc: NATS, subject: str, enough: int, wait: float = 0.2) -> int:
    """How many replicas answer `subject` within `wait` seconds (stops counting at `enough`)."""
    answered = 0
    done = asyncio.Event()

    async def count(msg: Msg) -> None:
        nonlocal answered
        if msg.headers and msg.headers.get("Status") == "503":
            return  # the server's "no responders", not a replica
        answered += 1
        if answered >= enough:
            done.set()

    subscription = await nc.subscribe(inbox := nc.new_inbox(), cb=count)
    try:
        await nc.publish(subject, b"", reply=inbox)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), wait)
        return answered
    finally:
        await subscription.unsubscribe()


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
        self._nats: EmbeddedNats | None = None
        self._env: dict[str, str] = {}
        self._processes: list[tuple[str, asyncio.subprocess.Process]] = []
        self._pumps: list[asyncio.Task[None]] = []

    async def start(self, timeout: float = 30.0) -> str:
        (self.data / "logs").mkdir(parents=True, exist_ok=True)
        if not self.url:
            self._nats = EmbeddedNats(
                self.data / "jetstream",
                port=self._port(),
                log_file=self.data / "logs" / "nats.log",
            )
            self.url = self._nats.start()
            (self.data / URL_FILE).write_text(self.url)
        env = {**os.environ, "RUNBUS_NATS_URL": self.url, "RUNBUS_DATA_DIR": str(self.data)}
        if self.echo is not None and self.echo.isatty():
            env.setdefault("RUNBUS_LOG_FORMAT", "console")
        self._env = env
        for service in self.services:
            for replica in range(self.replicas.get(service, 1)):
                await self._spawn(service if replica == 0 else f"{service}#{replica + 1}")
        await self._wait_ready(timeout, dict.fromkeys(self.services, 1))
        return self.url

    async def _spawn(self, label: str) -> None:
        service = label.split("#")[0]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"runbus_{service}",
            env={**self._env, **self.replica_env.get(label, {})},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._processes.append((label, process))
        self._pumps.append(asyncio.create_task(self._pump(label, process)))

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

    async def restart(self, label: str, timeout: float = 30.0) -> None:
        """Start a replica that `kill` stopped again, as a supervisor would, and wait until
        every replica of its service answers discovery."""
        await self._spawn(label)
        service = label.split("#")[0]
        await self._wait_ready(timeout, {service: self.replicas.get(service, 1)})

    def _port(self) -> int:
        if self.nats_port is not None:
            return self.nats_port
        return DEFAULT_PORT if _port_free(DEFAULT_PORT) else 0

    async def _pump(self, label: str, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        with open(self.data / "logs" / f"{label.replace('#', '-')}.log", "ab") as log:
            async for line in process.stdout:
                log.write(line)
                log.flush()
                if self.echo is not None:
                    self.echo.write(f"{label:>15} | {line.decode(errors='replace')}")
                    self.echo.flush()

    async def _wait_ready(self, timeout: float, replicas: dict[str, int]) -> None:
        """Each service answers `$SRV.PING.<name>` (nats.micro discovery) from as many
        replicas as `replicas` asks."""
        nc = await nats.connect(self.url)
        try:
            waiting = set(replicas)
            deadline = asyncio.get_running_loop().time() + timeout
            while waiting:
                for label, process in self._processes:
                    if process.returncode is not None:
                        raise StackError(
                            f"{label} exited with code {process.returncode}; see "
                            f"{self.data / 'logs' / label}.log"
                        )
                for service in list(waiting):
                    enough = replicas[service]
                    if await _responders(nc, f"$SRV.PING.{service}", enough) >= enough:
                        waiting.discard(service)
                if asyncio.get_running_loop().time() > deadline:
                    raise StackError(
                        f"not ready after {timeout:.0f}s: {', '.join(sorted(waiting))}"
                    )
                if waiting:
                    await asyncio.sleep(0.05)
        finally:
            await nc.close()

    async def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every service (each drains), then stop the embedded NATS."""
        for _, process in self._processes:
            if process.returncode is None:
                process.terminate()
        for _, process in self._processes:
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                process.kill()
                await process.wait()
        for pump in self._pumps:
            with contextlib.suppress(Exception):
                await pump
        self._processes.clear()
        if self._nats is not None:
            self._nats.stop()
            (self.data / URL_FILE).unlink(missing_ok=True)
            self._nats = None
