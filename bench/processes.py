"""The deployment shape for the benchmarks: five services as separate processes under a
ProcessStack, and gateway processes started here so a bench can add a replica, kill one
mid-run, or run one under pyinstrument; CPU time of every process read from /proc."""

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats
import nats.errors

from runbus import busauth, subjects
from runbus.messages.auth import Identity
from runbus.settings import load_settings
from runbus.supervisor import SERVICES, ProcessStack

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")

BENCH_AGENTS = {
    "bench": """
name = "bench"
instructions = "You are a travel assistant."
model = "scripted/bench"
tools = ["get_weather", "search_flights", "create_booking"]
# The same work as the MAF anchor: no memory (its cost is the memory section's), no guardrail.
[memory]
enabled = false
""",
    "resume": """
name = "resume"
instructions = "You wait, then answer."
model = "scripted/resume"
tools = ["get_weather", "wait_a_moment"]
""",
}

BENCH_SCRIPTS = """
[[bench]]
tool_calls = [{name = "get_weather", arguments = {city = "Sydney"}}]
[[bench]]
tool_calls = [{name = "search_flights", arguments = {origin = "Melbourne", destination = "Sydney", date = "2026-12-08"}}]
[[bench]]
tool_calls = [{name = "create_booking", arguments = {flight_id = "QF412-20261208"}}]
[[bench]]
text = "Booked: {last_result}"
[[resume]]
tool_calls = [{name = "wait_a_moment", arguments = {seconds = 1.0}}]
[[resume]]
tool_calls = [{name = "get_weather", arguments = {city = "Perth"}}]
[[resume]]
text = "Resumed: {last_result}"
"""  # noqa: E501


def status_mib(pid: int, field: str) -> float:
    """A memory figure of /proc/<pid>/status (`VmRSS`, `VmHWM`: peak RSS) in MiB; 0 if gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0.0
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak(pid: int) -> None:
    """Start a process's peak-RSS count afresh (Linux: 5 → clear_refs resets VmHWM)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (fields 14 and 15 of /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Bench:
    """A running stack: `url`, the service processes, the gateways started by `add_gateway`."""

    stack: ProcessStack
    env: dict[str, str]
    data: Path
    gateways: list[asyncio.subprocess.Process] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.stack.url

    def pids(self) -> dict[str, int]:
        # ProcessStack keeps its children private; reading their pids is all a bench needs.
        pids = {label: p.pid for label, p in self.stack._processes}
        pids.update({f"gateway#{i + 1}": p.pid for i, p in enumerate(self.gateways)})
        server = self.stack._nats.pid if self.stack._nats else None
        if server is not None:
            pids["nats-server"] = server
        return pids

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process, by label."""
        return {label: cpu_seconds(pid) for label, pid in self.pids().items()}

    def rss(self, field: str = "VmRSS") -> dict[str, float]:
        """Resident memory (or its peak, `VmHWM`) of each process now, MiB, by label."""
        return {label: status_mib(pid, field) for label, pid in self.pids().items()}

    def reset_peaks(self) -> None:
        for pid in self.pids().values():
            reset_peak(pid)

    async def add_gateway(self, profile_to: Path | None = None) -> asyncio.subprocess.Process:
        """One more gateway replica; under pyinstrument (a session file on exit) if asked."""
        before = await self._gateway_ids()
        command = [sys.executable, "-m", "runbus_gateway"]
        if profile_to is not None:
            command = [
                sys.executable,
                "-m",
                "pyinstrument",
                "-r",
                "pyisession",
                "-o",
                str(profile_to),
                "-m",
                "runbus_gateway",
            ]
        log = open(self.data / "logs" / f"gateway-{len(self.gateways) + 1}.log", "ab")  # noqa: SIM115
        process = await asyncio.create_subprocess_exec(
            *command, env=self.env, stdout=log, stderr=asyncio.subprocess.STDOUT
        )
        log.close()
        self.gateways.append(process)
        await self._wait_gateways(len(before) + 1, process)
        return process

    async def _gateway_ids(self) -> set[str]:
        """The ids of the gateway replicas that answer `$SRV.PING.gateway` (nats.micro)."""
        nc = await nats.connect(self.url, **service_login(self.data))
        try:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish("$SRV.PING.gateway", b"", reply=inbox)
            ids: set[str] = set()
            with contextlib.suppress(nats.errors.TimeoutError):
                while True:
                    msg = await sub.next_msg(timeout=0.3)
                    if msg.data:  # an empty one is the server's "no responders"
                        ids.add(msgspec.json.decode(msg.data)["id"])
            return ids
        finally:
            await nc.close()

    async def _wait_gateways(self, count: int, process: asyncio.subprocess.Process) -> None:
        for _ in range(200):
            if process.returncode is not None:
                raise RuntimeError(f"gateway exited with {process.returncode}; see {self.data}")
            if len(await self._gateway_ids()) >= count:
                return
            await asyncio.sleep(0.1)
        raise RuntimeError("gateway replica not ready after 60 s")

    async def stop_gateway(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM: the gateway drains, and a profiled one writes its profile."""
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()
        self.gateways.remove(process)


OPEN_BUS_ALICE = Identity(tenant="acme", user_id="alice", inbox_prefix="_INBOX")
"""Who the dev token `dev-alice` stands for, given to clients of the in-process stacks: their
bus has no auth service to ask."""


def service_login(data: Path) -> dict[str, str]:
    """Connect options of a service on the stack's secured bus (none on an open bus)."""
    credentials = busauth.stack_credentials(data, busauth.SERVICE_USER)
    if credentials is None:
        return {}
    return {
        "user": credentials.user,
        "password": credentials.password,
        "inbox_prefix": subjects.SERVICE_INBOX_PREFIX,
    }


def service_env(data: Path) -> dict[str, str]:
    """Environment of a service process the bench starts itself on the secured bus."""
    folder = busauth.secrets_dir(data).resolve()
    return {
        "RUNBUS_NATS_USER": busauth.SERVICE_USER,
        "RUNBUS_NATS_PASSWORD_FILE": str(folder / f"{busauth.SERVICE_USER}.password"),
    }


def prepare(tmp: Path, agents: dict[str, str] | None = None) -> dict[str, str]:
    """Agent files, scripts and the bench's extra tool module; the environment for children."""
    (tmp / "agents").mkdir(exist_ok=True)
    for name, text in {**BENCH_AGENTS, **(agents or {})}.items():
        (tmp / "agents" / f"{name}.toml").write_text(text)
    (tmp / "scripts.toml").write_text(BENCH_SCRIPTS)
    return {
        "RUNBUS_AGENTS_DIR": str(tmp / "agents"),
        "RUNBUS_MODEL_SCRIPTS": str(tmp / "scripts.toml"),
        "RUNBUS_TOOL_MODULES": "runbus_examples.travel,bench.slow_tools",
        "RUNBUS_LOG_LEVEL": "warning",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def _print_logs(logs: Path, lines: int = 15) -> None:
    """The last lines of every process's log: the logs go with the temporary directory."""
    for log in sorted(logs.glob("*.log")):
        kept = [
            line for line in log.read_text(errors="replace").splitlines() if "[INF]" not in line
        ]
        tail = kept[-lines:]
        print(f"--- {log.name}", *tail, sep="\n", file=sys.stderr)


@asynccontextmanager
async def process_stack(
    gateways: int = 1, agents: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[Bench]:
    """Five services under a ProcessStack plus `gateways` gateway processes of our own; more
    agent files and environment for every process if given."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        extra = {**prepare(tmp, agents), **(env or {})}
        saved = dict(os.environ)
        os.environ.update(extra)
        try:
            settings = msgspec.structs.replace(
                load_settings(), data_dir=str(tmp / "pdata"), log_level="warning", nats_url=None
            )
            services = tuple(s for s in SERVICES if s != "gateway")
            stack = ProcessStack(settings, services=services, nats_port=0, echo=None)
            url = await stack.start(timeout=90)
            env = {
                **os.environ,
                "RUNBUS_NATS_URL": url,
                "RUNBUS_DATA_DIR": settings.data_dir,
                **service_env(Path(settings.data_dir)),
            }
            bench = Bench(stack, env, Path(settings.data_dir))
            try:
                for _ in range(gateways):
                    await bench.add_gateway()
                yield bench
            except BaseException:
                _print_logs(bench.data / "logs")
                raise
            finally:
                for process in list(bench.gateways):
                    await bench.stop_gateway(process)
                await stack.stop()
        finally:
            os.environ.clear()
            os.environ.update(saved)
