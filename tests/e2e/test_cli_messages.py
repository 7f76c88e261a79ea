"""The CLI as a user meets it: `runbus up` in a terminal (a pty) prints no secret, writes JSON
log files `runbus logs` reads, and stops clean on Ctrl-C, before or after it is ready; every
expected failure of a command is one line on stderr, never a traceback."""

import asyncio
import os
import pty
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runbus.embedded import EmbeddedNats
from runbus_examples import AGENTS_DIR

RUNBUS = str(Path(sys.executable).parent / "runbus")
PASSWORD = "s3cret-pw"


def processes_of(data_dir: Path) -> list[int]:
    """Processes (services, nats-server, `runbus up`) started for `data_dir`."""
    marker = f"RUNBUS_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


class Terminal:
    """The reading end of a pty a child writes its stderr to."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.text = ""
        self._reader = asyncio.StreamReader()

    async def attach(self) -> None:
        loop = asyncio.get_running_loop()
        os.close(self.slave)
        loop.add_reader(self.master, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the child closed its end
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            self._reader.feed_eof()
            return
        self._reader.feed_data(data)

    async def until(self, needle: str, timeout: float = 120) -> str:
        async with asyncio.timeout(timeout):
            while needle not in self.text:
                chunk = await self._reader.read(65536)
                if not chunk:
                    raise AssertionError(f"{needle!r} never came; got:\n{self.text[-3000:]}")
                self.text += chunk.decode(errors="replace")
        return self.text

    async def rest(self) -> str:
        while chunk := await self._reader.read(65536):
            self.text += chunk.decode(errors="replace")
        os.close(self.master)
        return self.text


async def start_up(env: dict[str, str], *args: str) -> tuple[asyncio.subprocess.Process, Terminal]:
    terminal = Terminal()
    process = await asyncio.create_subprocess_exec(
        RUNBUS, "up", *args, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=terminal.slave,
        stderr=terminal.slave,
    )  # fmt: skip
    await terminal.attach()
    return process, terminal


async def command(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        RUNBUS, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@dataclass
class Up:
    process: asyncio.subprocess.Process
    terminal: Terminal
    env: dict[str, str]
    data_dir: Path
    nats: EmbeddedNats


@pytest.fixture(scope="module")
async def up(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Up]:
    """`runbus up` in a terminal, on a NATS URL that carries a password."""
    data_dir = tmp_path_factory.mktemp("up")
    # Besides the demo agent, one whose model books a business fare: the run waits for a
    # person's approval, and `runbus run` with it.
    agents = data_dir / "agents"
    agents.mkdir()
    shutil.copy(AGENTS_DIR / "travel.toml", agents)
    (agents / "approver.toml").write_text(
        'name = "approver"\ninstructions = "Book."\nmodel = "scripted/book"\n'
        'tools = ["create_booking"]\n'
    )
    scripts = data_dir / "scripts.toml"
    scripts.write_text(
        "[[book]]\n"
        'tool_calls = [{name = "create_booking", arguments = {flight_id = "QF412-20261208", '
        'cabin = "business"}}]\n'
    )
    with EmbeddedNats(data_dir / "external") as server:
        url = server.url.replace("nats://", f"nats://runbus:{PASSWORD}@")
        env = {
            **os.environ,
            "RUNBUS_DATA_DIR": str(data_dir),
            "RUNBUS_NATS_URL": url,
            "RUNBUS_AGENTS_DIR": str(agents),
            "RUNBUS_MODEL_SCRIPTS": str(scripts),
        }
        process, terminal = await start_up(env)
        try:
            await terminal.until("runbus: up:")
            yield Up(process, terminal, env, data_dir, server)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
                await process.wait()


async def test_runbus_up_prints_the_nats_url_without_its_password(up: Up) -> None:
    assert PASSWORD not in up.terminal.text
    assert "NATS at nats://runbus:***@127.0.0.1:" in up.terminal.text


async def test_a_failed_run_is_one_line_and_no_traceback(up: Up) -> None:
    code, out, err = await command(up.env, "run", "--agent", "nope", "hi")

    assert code == 1
    assert "run failed [unknown_agent]: no agent named 'nope'" in out
    assert "Traceback" not in err
    assert err == ""


async def test_runbus_logs_finds_a_run_after_runbus_up_in_a_terminal(up: Up) -> None:
    code, out, _ = await command(up.env, "run", "--run-id", "r-logs-tty", "Weather in Perth?")
    assert code == 0, out

    code, shown, err = await command(up.env, "logs", "r-logs-tty")

    assert code == 0, err
    assert {"gateway", "model_router"} <= {
        line.split()[1] for line in shown.splitlines() if line.strip()
    }


async def test_ctrl_c_on_runbus_run_says_interrupted_without_a_traceback(up: Up) -> None:
    process = await _run_waiting_for_approval(up, "s-ctrl-c")
    process.send_signal(signal.SIGINT)
    _, err = await process.communicate()

    assert process.returncode == 130
    assert err.decode().strip().splitlines()[-1] == "runbus: interrupted"
    assert "Traceback" not in err.decode()


async def test_a_command_whose_nats_goes_away_says_so_in_one_line(up: Up) -> None:
    # `runbus run` keeps waiting on the run's events; then NATS stops.
    process = await _run_waiting_for_approval(up, "s-gone")
    up.nats.stop()
    async with asyncio.timeout(60):
        _, err = await process.communicate()

    # The wait notice ("  … waiting for a decision …") may come first on a slow machine: it
    # is progress, not part of the error, which must be one line of its own.
    lines = [line for line in err.decode().splitlines() if not line.startswith("  … ")]
    assert process.returncode == 1
    assert len(lines) == 1, err.decode()
    assert lines[0].startswith("runbus: lost the connection to NATS")
    assert "runbus status" in lines[0]
    assert "Traceback" not in err.decode()


async def test_ctrl_c_on_runbus_up_drains_and_leaves_no_process(up: Up) -> None:
    up.process.send_signal(signal.SIGINT)
    code = await up.process.wait()
    text = await up.terminal.rest()

    assert code == 0
    assert "Traceback" not in text
    assert text.rstrip().endswith("runbus: stopped")
    assert processes_of(up.data_dir) == []


async def test_ctrl_c_while_runbus_up_starts_stops_everything_it_started(tmp_path: Path) -> None:
    env = {**os.environ, "RUNBUS_DATA_DIR": str(tmp_path)}
    env.pop("RUNBUS_NATS_URL", None)
    process, terminal = await start_up(env)
    await terminal.until("startup_step")  # services are starting, none is ready

    process.send_signal(signal.SIGINT)
    code = await process.wait()
    text = await terminal.rest()

    assert code == 130
    assert "runbus: stopping before every service was ready" in text
    assert "Traceback" not in text
    assert processes_of(tmp_path) == []
    assert not (tmp_path / "nats.url").exists()


async def test_without_a_stack_a_command_says_so_instead_of_guessing_a_server(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "RUNBUS_DATA_DIR": str(tmp_path)}
    env.pop("RUNBUS_NATS_URL", None)

    code, _, err = await command(env, "run", "hi")

    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("runbus: no runbus stack is running here")
    assert "`runbus up`" in err


async def test_a_recorded_stack_that_is_gone_is_named_as_not_running(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "js") as server:
        url = server.url
    (tmp_path / "nats.url").write_text(url)
    env = {**os.environ, "RUNBUS_DATA_DIR": str(tmp_path)}
    env.pop("RUNBUS_NATS_URL", None)

    code, _, err = await command(env, "sessions", "list")

    assert code == 1
    assert err.count("\n") == 1
    assert f"({url}) does not answer: it is not running any more" in err


def _as_from_a_terminal(*argv: str) -> tuple[str, ...]:
    """`argv` run with Ctrl-C at its default, as from a terminal: a suite started in the
    background (`make test &`) has SIGINT ignored, every process it starts inherits that, and a
    command started so rightly ignores Ctrl-C."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return (sys.executable, "-c", reset, *argv)


async def _run_waiting_for_approval(up: Up, session: str) -> asyncio.subprocess.Process:
    """`runbus run` of a business fare, once it says the run waits for a person's approval
    (the command keeps waiting too)."""
    process = await asyncio.create_subprocess_exec(
        *_as_from_a_terminal(
            RUNBUS, "run", "Book QF412 in business", "--agent", "approver", "--session", session
        ),
        env=up.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    shown = b""
    async with asyncio.timeout(60):
        while b"needs approval" not in shown:
            line = await process.stdout.readline()
            assert line, shown.decode()
            shown += line
    return process
