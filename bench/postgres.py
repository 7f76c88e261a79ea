"""A throwaway PostgreSQL server for the LangGraph + Postgres anchor: the machine's binaries
(Debian's `postgresql` package; `make bench` installs it when absent), `initdb` into a
temporary folder, a random loopback port, fsync and synchronous_commit on (the durable
setting). Where it cannot start, `Unavailable` says why and the bench skips that row."""

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class Unavailable(Exception):
    """No PostgreSQL server could be started here; the message says why."""


@dataclass(frozen=True)
class Postgres:
    dsn: str
    pid: int
    """The postmaster: its CPU (and its children's) is the database's share of a run."""


def binaries() -> Path:
    """The folder with `initdb` and `pg_ctl`: on PATH, or Debian's versioned folder."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if versions:
        return Path(versions[-1]).parent
    raise Unavailable("no PostgreSQL binaries (apt-get install -y postgresql)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_as(user: str | None, args: list[str]) -> None:
    done = subprocess.run(args, user=user, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Unavailable(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout)[-400:]}")


@contextlib.contextmanager
def server() -> Iterator[Postgres]:
    """A running server for the duration of the block; removed afterwards."""
    bin_dir = binaries()
    # PostgreSQL refuses to run as root; Debian's package creates the `postgres` user.
    user: str | None = None
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres").pw_name
        except KeyError:
            raise Unavailable("running as root and there is no `postgres` user") from None
    with tempfile.TemporaryDirectory(prefix="runbus-bench-pg-") as tmp:
        root = Path(tmp)
        data = root / "data"
        if user is not None:
            shutil.chown(root, user)
        port = free_port()
        _run_as(user, [str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "bench"])
        # Equal durability with runbus's NATS (fsync before ack): a commit is on disk first.
        options = (
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=on "
            "-c synchronous_commit=on -c max_connections=200"
        )
        pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(data)]
        _run_as(user, [*pg_ctl, "-o", options, "-w", "-l", str(root / "log"), "start"])
        try:
            pid = int((data / "postmaster.pid").read_text().split()[0])
            yield Postgres(dsn=f"postgresql://bench@127.0.0.1:{port}/postgres", pid=pid)
        finally:
            subprocess.run(
                [*pg_ctl, "-m", "fast", "-w", "stop"],
                user=user,
                capture_output=True,
                check=False,
            )
