"""Run a Markdown page's commands in order, as written, and check what each prints.

A page is read for its fenced blocks. A block of `$ ` lines is a terminal session: each `$`
line is a command (a `<<'TAG'` heredoc runs on to its `TAG` line), the lines after it are
what it prints. A `sh` block is a list of shell commands, a `python` block one program fed to
`.venv/bin/python -`. Matching is by facts, never by time:

- a printed line is expected in order among the command's output lines, `…` standing for any
  text (a line that is only `…` for any lines); NATS URLs compare without their port;
- `<run_id>` and `<call_id>` in a command are the last ones an earlier command printed;
- a command that waits for a person's decision (it printed an approval request) goes on in
  the background, as in a second terminal, and must end well once a later command decided;
- `runbus up` and `runbus http` are the page's other terminals: started in the background,
  ready once they say so (up: `Ctrl-C to stop`; http: its listening log line).
"""

import asyncio
import json
import os
import re
import shlex
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

FENCE: Final = re.compile(r"^```([a-z]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
RUN_ID: Final = re.compile(r"\br-[0-9a-f]{16}\b")
CALL_ID: Final = re.compile(r"runbus approve r-[0-9a-f]{16} (\S+)|\"call_id\":\s*\"([^\"]+)\"")
NATS_PORT: Final = re.compile(r"(nats://[^\s:;,/]+):\d+")
WAITING: Final = ("runbus approve r-", '"type":"run.approval_requested"')
"""What a command prints when its run waits for a person's decision (the line that names
the call to decide)."""
COMMAND_TIMEOUT: Final = 60.0


@dataclass
class Step:
    """One command of the page and the lines it shows it printing."""

    command: str
    expected: list[str] = field(default_factory=list)
    language: str = ""
    """`` for a `$` session, `sh`, or `python`."""


@dataclass
class Block:
    language: str
    text: str


def blocks(markdown: str) -> list[Block]:
    return [Block(m.group(1), m.group(2)) for m in FENCE.finditer(markdown)]


def session_steps(text: str) -> list[Step]:
    """The `$` commands of a terminal session block, each with the lines after it."""
    steps: list[Step] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            if heredoc := re.search(r"<<'(\w+)'\s*$", command):
                body = list(_until(lines, heredoc.group(1)))
                command = "\n".join([command, *body, heredoc.group(1)])
            steps.append(Step(command))
        elif steps and line.strip():
            steps[-1].expected.append(line.strip())
    return steps


def _until(lines: Iterator[str], tag: str) -> Iterator[str]:
    for line in lines:
        if line == tag:
            return
        yield line


def shell_steps(text: str) -> list[Step]:
    """The commands of a `sh` block: a command runs on over `\\` and open quotes; comment
    lines are dropped."""
    steps: list[Step] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\") or not _complete(pending):
            continue
        steps.append(Step(pending, language="sh"))
        pending = ""
    return steps


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # no closing quotation yet
        return False
    return True


def exec_form(command: str) -> str:
    """A simple command (`A=1 B=2 prog args  # comment`) as `A=1 B=2 exec prog args`."""
    words = shlex.split(command.replace("\\\n", " "), comments=True)
    assignments = [w for w in words if re.fullmatch(r"[A-Za-z_]\w*=.*", w)]
    rest = words[len(assignments) :]
    assert words[: len(assignments)] == assignments, command
    return " ".join([*map(shlex.quote, assignments), "exec", *map(shlex.quote, rest)])


def matches(expected: list[str], printed: str) -> str | None:
    """None if every expected line is found in order among the printed lines, else the first
    one that is not."""
    lines = [_comparable(line) for line in printed.splitlines()]
    at = 0
    for wanted in expected:
        if wanted == "…":
            continue
        pattern = re.compile(
            ".*".join(re.escape(part) for part in _comparable(wanted).split("…")) + r"\s*$"
        )
        while at < len(lines) and not pattern.match(lines[at].strip()):
            at += 1
        if at == len(lines):
            return wanted
        at += 1
    return None


def _comparable(line: str) -> str:
    return NATS_PORT.sub(r"\1:…", line.strip())


@dataclass
class Ran:
    step: Step
    code: int | None
    printed: str


class Walkthrough:
    """Runs steps in one working directory and environment, as a user at a shell would."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.printed = ""
        """Everything every command printed so far (for `<run_id>` and `<call_id>`)."""
        self.background: list[tuple[Step, asyncio.subprocess.Process, asyncio.Task[str]]] = []
        self.http_port: int | None = None

    def fill(self, command: str) -> str:
        if "<run_id>" in command:
            run_ids = RUN_ID.findall(self.printed)
            assert run_ids, f"no run id printed before {command!r}"
            command = command.replace("<run_id>", run_ids[-1])
        if "<call_id>" in command:
            calls = [a or b for a, b in CALL_ID.findall(self.printed)]
            assert calls, f"no call id printed before {command!r}"
            command = command.replace("<call_id>", calls[-1])
        if self.http_port is not None:
            command = command.replace("127.0.0.1:8080", f"127.0.0.1:{self.http_port}")
        return command

    async def _start(
        self, step: Step, *, replace_shell: bool = False
    ) -> asyncio.subprocess.Process:
        if step.language == "python":
            argv = [str(self.cwd / ".venv" / "bin" / "python"), "-"]
        elif replace_shell:
            argv = ["sh", "-c", exec_form(self.fill(step.command))]
        else:
            argv = ["sh", "-c", self.fill(step.command)]
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=self.cwd, env=self.env, start_new_session=True,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert process.stdin is not None
        if step.language == "python":
            process.stdin.write(self.fill(step.command).encode())
        process.stdin.close()
        return process

    async def terminal(self, step: Step, ready: str) -> str:
        """Start a command that runs until stopped (`runbus up`); return once it printed a
        line with `ready` in it."""
        # The command in the shell's place: Ctrl-C (SIGINT to the group) reaches it alone,
        # as in an interactive shell, which never dies of its job's Ctrl-C.
        process = await self._start(step, replace_shell=True)
        assert process.stdout is not None
        said = ""
        async with asyncio.timeout(COMMAND_TIMEOUT * 2):
            while ready not in said:
                line = (await process.stdout.readline()).decode()
                assert line, f"{step.command!r} ended before it was ready:\n{said}"
                said += line
        self.background.append((step, process, asyncio.ensure_future(_rest(process))))
        self.printed += said
        return said

    async def http(self) -> None:
        """`runbus http` on a free port, standing in for the page's port 8080."""
        env = {**self.env, "RUNBUS_LOG_FORMAT": "json"}
        process = await asyncio.create_subprocess_exec(
            str(self.cwd / ".venv" / "bin" / "runbus"), "http", "--port", "0", cwd=self.cwd,
            env=env, start_new_session=True, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stderr is not None
        async with asyncio.timeout(COMMAND_TIMEOUT):
            while True:
                line = (await process.stderr.readline()).decode()
                assert line, "runbus http ended before it listened"
                if '"http_listening"' in line:
                    self.http_port = int(json.loads(line)["url"].rsplit(":", 1)[1])
                    break
        drained = asyncio.ensure_future(_rest(process, process.stderr))
        self.background.append((Step("runbus http"), process, drained))

    async def run(self, step: Step) -> Ran:
        """Run one command to its end, or, when it waits for a decision, into the background."""
        process = await self._start(step)
        assert process.stdout is not None
        said = ""
        async with asyncio.timeout(COMMAND_TIMEOUT):
            while line := (await process.stdout.readline()).decode():
                said += line
                if any(marker in line for marker in WAITING):
                    self.printed += said
                    rest = asyncio.ensure_future(_rest(process, already=said))
                    self.background.append((step, process, rest))
                    return Ran(step, None, said)
            code = await process.wait()
        self.printed += said
        return Ran(step, code, said)

    async def finish_waiting(self) -> list[Ran]:
        """The commands that waited for a decision, once they ended."""
        finished = []
        for step, process, rest in list(self.background):
            if step.command.startswith("runbus http") or "runbus up" in step.command:
                continue
            said = await asyncio.wait_for(rest, COMMAND_TIMEOUT)
            self.background.remove((step, process, rest))
            self.printed += said  # twice the part before the decision: no harm to ids
            finished.append(Ran(step, process.returncode, said))
        return finished

    async def stop(self) -> list[Ran]:
        """SIGINT (Ctrl-C) to every background terminal, the last started first."""
        stopped = []
        for step, process, rest in reversed(self.background):
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGINT)
            said = await asyncio.wait_for(rest, COMMAND_TIMEOUT)
            stopped.append(Ran(step, process.returncode, said))
        self.background.clear()
        return stopped


async def _rest(
    process: asyncio.subprocess.Process,
    stream: asyncio.StreamReader | None = None,
    *,
    already: str = "",
) -> str:
    """What `process` printed `already` and prints on `stream` (default stdout) until it
    ends."""
    stream = stream or process.stdout
    assert stream is not None
    said = (await stream.read()).decode()
    await process.wait()
    return already + said
