"""README.md as a new user follows it: every command of its fenced blocks, in order, as
written, in a fresh directory (`runbus up` in the background stands in for terminal 1, and
`runbus http` for the terminal serving port 8080), each checked against what the README
shows it printing. An edited README is what is tested: a step that breaks fails here."""

import os
import sys
from pathlib import Path
from typing import Final

from tests.e2e.walkthrough import (
    Ran,
    Step,
    Walkthrough,
    blocks,
    matches,
    session_steps,
    shell_steps,
)

REPO: Final = Path(__file__).resolve().parents[2]
VENV: Final = Path(sys.executable).parent.parent

NOT_RUN: Final = {
    "make ": "`make run` is `runbus demo` (tests/e2e/test_demo.py), `make test` this suite",
    "nats ": "the nats CLI is installed separately; the nats-py block runs the same exchange",
}
"""Commands of the README the walkthrough leaves out, by how they start, and why."""

Facts = dict[str, list[str]]

SHOWN_BY_COMMENT: Final[Facts] = {
    "from openai import OpenAI": ["['travel']", "Sydney"],
    "import asyncio, uuid\nimport httpx": ["Sydney"],
    "curl -N": ["event: run.approval_requested", "event: run.completed", "Booked QF412"],
    "curl -H": ['"decision":"approved"'],
}
"""What a block without shown output prints, as its comments and prose say (by the start of
its command)."""


def fresh_directory(tmp_path: Path) -> dict[str, str]:
    """A directory like a fresh clone after `make setup` (its `.venv`, its `examples/`), and
    an environment with no runbus or OpenTelemetry setting of the developer's."""
    (tmp_path / ".venv").symlink_to(VENV)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return {k: v for k, v in os.environ.items() if not k.startswith(("RUNBUS_", "OTEL_"))}


def steps_of(language: str, text: str) -> list[Step] | None:
    """The commands of one block; None for a block of commands left out (`NOT_RUN`)."""
    match language:
        case "text":  # what something prints, not a command
            return None
        case "" if "\n$ " in f"\n{text}":
            return session_steps(text)
        case "sh":
            return shell_steps(text)
        case "python":
            return [Step(text, language="python")]
        case "":
            for step in shell_steps(text):
                assert step.command.startswith(tuple(NOT_RUN)), (
                    f"a command the walkthrough does not run: {step.command!r}"
                )
            return None
        case _:
            raise AssertionError(f"a block in {language!r}: teach the walkthrough to run it")


def check(ran: Ran, shown: Facts) -> None:
    command = ran.step.command.splitlines()[0]
    assert ran.code == 0, f"{command!r} exited {ran.code}:\n{ran.printed}"
    assert ran.printed.strip(), f"{command!r} printed nothing"
    missing = matches(ran.step.expected, ran.printed)
    assert missing is None, f"{command!r} did not print {missing!r}; it printed:\n{ran.printed}"
    for start, facts in shown.items():
        if ran.step.command.lstrip().startswith(start):
            for fact in facts:
                assert fact in ran.printed, f"{command!r} did not print {fact!r}:\n{ran.printed}"


async def walk_page(page: Path, walk: Walkthrough, shown: Facts) -> int:
    """Run every block of `page` in order; the number of commands run. A command that waited
    for a decision is checked once the page is done (the decision may come blocks later)."""
    commands = 0
    for block in blocks(page.read_text()):
        steps = steps_of(block.language, block.text)
        if steps is None:
            continue
        if "127.0.0.1:8080" in block.text and walk.http_port is None:
            await walk.http()
        for step in steps:
            commands += 1
            if "runbus up" in step.command:
                said = await walk.terminal(step, "Ctrl-C to stop")
                missing = matches(step.expected, said)
                assert missing is None, f"runbus up did not print {missing!r}:\n{said}"
                continue
            ran = await walk.run(step)
            if ran.code is not None:  # else it waits for a decision a later command makes
                check(ran, shown)
    for ran in await walk.finish_waiting():
        check(ran, shown)
    return commands


async def test_every_command_of_the_readme_runs_as_written_and_prints_what_it_shows(
    tmp_path: Path,
) -> None:
    walk = Walkthrough(tmp_path, fresh_directory(tmp_path))
    try:
        commands = await walk_page(REPO / "README.md", walk, SHOWN_BY_COMMENT)
    finally:
        stopped = await walk.stop()

    for ran in stopped:
        assert ran.code == 0, f"{ran.step.command!r} did not stop cleanly:\n{ran.printed}"
    # runbus up, run, status, logs; the nats-py program; OpenAI; two curls; A2A.
    assert commands == 9
