"""Hosts as network namespaces on one bridge, and the network faults between them.

The bridge lives in a namespace of its own and every address is inside a namespace this module
made (`rbj-<pid>-…`): the machine's own network is never touched. Partitions are iptables DROP
rules inside the hosts' namespaces, as Jepsen makes them: packets vanish, connections hang.
"""

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

PREFIX: Final = "rbj-"
SUBNET: Final = "10.99.0"
CLONE_NEWNET: Final = 0x40000000
NETNS_DIR: Final = "/run/netns"
TMP: Final = Path(tempfile.gettempdir())


class NetnsRefused(RuntimeError):
    """This machine would not let the harness make or change a namespace (not root, no
    iproute2 or iptables, a kernel without network namespaces)."""

    def __init__(self, command: list[str], problem: str) -> None:
        super().__init__(
            f"the cluster harness needs root with iproute2 and iptables (network namespaces, "
            f"veth, a bridge, iptables inside them); `{' '.join(command)}` failed: {problem}"
        )
        self.command = command
        self.problem = problem


def sh(*command: str) -> str:
    """Run one iproute2/iptables command; any failure is `NetnsRefused` with its own words."""
    args = list(command)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetnsRefused(args, str(error)) from None
    if done.returncode != 0:
        raise NetnsRefused(args, (done.stderr or done.stdout).strip() or f"exit {done.returncode}")
    return done.stdout


def preflight() -> None:
    """Fail at once, saying why, where namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise NetnsRefused(["id", "-u"], f"running as uid {os.geteuid()}, not root")
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            raise NetnsRefused([tool], "not installed (apt-get install iproute2 iptables)")


@dataclass(frozen=True)
class Host:
    name: str
    """Its role in the run: `n1`, `c`."""
    netns: str
    """The namespace: `rbj-<pid>-n1`."""
    address: str

    def exec(self, *command: str) -> list[str]:
        """`command` run inside this host."""
        return ["ip", "netns", "exec", self.netns, *command]


@dataclass
class Network:
    """`names` as hosts on one bridge; `create` makes them, `remove` (idempotent) kills every
    process still inside them and deletes them."""

    names: list[str]
    owner: int = field(default_factory=os.getpid)
    hosts: dict[str, Host] = field(default_factory=dict)
    _made: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.owner}-sw"

    def create(self) -> None:
        preflight()
        atexit.register(self.remove)
        self._add(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for index, name in enumerate(self.names, start=1):
            host = Host(name, f"{PREFIX}{self.owner}-{name}", f"{SUBNET}.{index + 10}")
            self._add(host.netns)
            # Both ends made inside namespaces: the pair never appears in the machine's own.
            sh("ip", "-n", self.switch, "link", "add", name, "type", "veth",
               "peer", "name", "eth0", "netns", host.netns)  # fmt: skip
            sh("ip", "-n", self.switch, "link", "set", name, "master", "br0", "up")
            sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", host.netns, "link", "set", "lo", "up")
            self.hosts[name] = host

    def _add(self, netns: str) -> None:
        sh("ip", "netns", "add", netns)
        self._made.append(netns)

    def remove(self) -> None:
        for netns in reversed(self._made):
            remove_netns(netns)
        self._made.clear()

    # -- faults ------------------------------------------------------------------------

    def split(self, side: Iterable[str], other: Iterable[str]) -> None:
        """Drop every packet between the hosts of `side` and those of `other`, both ways,
        on both ends (what each host sends and what it receives)."""
        a = [self.hosts[n] for n in side]
        b = [self.hosts[n] for n in other]
        for near, far in [*((x, b) for x in a), *((y, a) for y in b)]:
            for peer in far:
                sh(*near.exec("iptables", "-A", "INPUT", "-s", peer.address, "-j", "DROP"))
                sh(*near.exec("iptables", "-A", "OUTPUT", "-d", peer.address, "-j", "DROP"))

    def isolate(self, name: str) -> None:
        """Cut `name` off from every other host."""
        self.split([name], [n for n in self.names if n != name])

    def heal(self) -> None:
        for host in self.hosts.values():
            sh(*host.exec("iptables", "-F"))

    def rules(self) -> dict[str, int]:
        """DROP rules in force per host (0 everywhere once healed)."""
        return {
            name: sh(*host.exec("iptables", "-S")).count("-j DROP")
            for name, host in self.hosts.items()
        }


def remove_netns(netns: str) -> None:
    """SIGKILL whatever still runs inside `netns`, then delete it (gone already is fine)."""
    with contextlib.suppress(NetnsRefused):
        for pid in sh("ip", "netns", "pids", netns).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGCONT)
                os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(NetnsRefused):
        sh("ip", "netns", "delete", netns)


def remove_stale(folder: Path = TMP) -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (a SIGKILLed pytest runs
    no finalizer), and their `rbj-<pid>-…` folders under `folder`; what was removed."""
    stale = []
    listed = ""
    if shutil.which("ip") is not None:
        with contextlib.suppress(NetnsRefused):
            listed = sh("ip", "netns", "list")
    for line in listed.splitlines():
        netns = line.split()[0] if line.split() else ""
        if _stale(netns):
            remove_netns(netns)
            stale.append(netns)
    for path in folder.glob(f"{PREFIX}*"):
        if path.is_dir() and _stale(path.name):
            shutil.rmtree(path, ignore_errors=True)
            stale.append(str(path))
    return stale


def _stale(name: str) -> bool:
    """Named by `rbj-<pid>-…` of a process that is gone."""
    owner = name.removeprefix(PREFIX).split("-")[0]
    return name.startswith(PREFIX) and owner.isdigit() and not _alive(int(owner))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise NetnsRefused(["setns"], os.strerror(error))


@contextlib.contextmanager
def inside(host: Host) -> Iterator[None]:
    """This thread (the test's event loop) on `host`'s network: every socket it opens meanwhile
    is that host's, as a client process there would be; back to where it was afterwards."""
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"{NETNS_DIR}/{host.netns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(original)
