"""`runbus chat`: talk to an agent in the terminal, with slash commands that read the session
without a model call; and `runbus todos <session>`, the todo list of a session.

Each line you type is one run: its answer streams as it arrives, tool calls and results show
inline. Slash commands go through the gateway's authenticated API (as RUNBUS_TOKEN).
"""

import argparse
import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Final, Literal, TextIO

import msgspec

from .. import modes, ops, todos
from ..client import RunbusClient, new_run_id
from ..errors import RemoteError, RunbusError, Unavailable
from ..messages import HistoryLoad, RunApprovalRequested, is_identifier
from ..messages.memory import MemoryList
from ..messages.runs import ApprovalDecide
from ..messages.sessions import (
    SessionGet,
    SessionRecord,
    SessionStateUpdate,
)
from ..render import EventPrinter
from ..settings import Settings
from ._common import Subparsers, connected
from .sessions import transcript_line

HELP: Final = """\
  /history            the session's transcript
  /todos              the agent's todo list
  /mode [plan|execute]  show or switch the agent's mode
  /memory             what the agent remembers about you
  /session            the session; /session new, /session switch <id>
  /trace              the last run's trace id (and Jaeger link)
  /approve [note], /deny [note]  decide the call the run waits on
  /help, /quit"""

MODE_ATTEMPTS: Final = 5


def new_session_id() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


class ChatConsole:
    """The console without a terminal: feed it lines, read what it writes to `out`."""

    def __init__(
        self,
        client: RunbusClient,
        *,
        agent: str,
        session_id: str,
        out: TextIO,
        jaeger_url: str | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.client = client
        self.agent = agent
        self.session_id = session_id
        self.out = out
        self.jaeger_url = jaeger_url.rstrip("/") if jaeger_url else None
        self.timeout = timeout
        self.last_run_id: str | None = None
        self.last_trace_id: str | None = None
        self.waiting: RunApprovalRequested | None = None
        """The approval the last run is paused on, if any."""
        self._seen = 0
        """Stream sequence of the last event shown, to go on after a decision."""
        self._commands: dict[str, Callable[[list[str]], Awaitable[None]]] = {
            "history": self.history,
            "todos": self.todos,
            "mode": self.mode,
            "memory": self.memory,
            "session": self.session,
            "trace": self.trace,
            "approve": self.approve,
            "deny": self.deny,
            "help": self.help,
        }

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    async def run(self, lines: AsyncIterator[str]) -> None:
        """Handle lines until `/quit` or the end of input."""
        self.say(f"runbus chat: agent {self.agent}, session {self.session_id}. /help for help.")
        async for line in lines:
            if not await self.handle(line):
                return

    async def handle(self, line: str) -> bool:
        """One line: a slash command or a message to the agent. False when it was `/quit`."""
        text = line.strip()
        if not text:
            return True
        if not text.startswith("/"):
            await self.send(text)
            return True
        name, *args = text[1:].split()
        if name in ("quit", "exit"):
            return False
        command = self._commands.get(name)
        if command is None:
            self.say(f"unknown command /{name}; /help lists them")
            return True
        try:
            await command(args)
        except RunbusError as exc:
            self.say(f"/{name} failed: {exc}")
        return True

    async def send(self, text: str) -> None:
        """One run: publish it, then show its events as they come."""
        if self.waiting is not None:
            self.say("  the last run waits for your decision: /approve or /deny first")
            return
        try:
            run_id, trace_id = await self.client.start_traced(
                self.agent, text, session_id=self.session_id, run_id=new_run_id()
            )
        except RunbusError as exc:
            self.say(f"  error: {exc}")
            return
        self.last_run_id, self.last_trace_id, self._seen = run_id, trace_id, 0
        await self._follow(run_id)

    async def _follow(self, run_id: str) -> None:
        """Show the run's events after the last one shown, until it ends or waits for an
        approval (then the prompt is back, for `/approve` or `/deny`)."""
        printer = EventPrinter(self.out)
        items = self.client.follow(run_id, after=self._seen, timeout=self.timeout)
        try:
            # Closed on every way out, so no subscription is left behind for the drain.
            async with aclosing(items):
                async for item in items:
                    self._seen = item.seq
                    printer(item.event)
                    if isinstance(item.event, RunApprovalRequested):
                        self.waiting = item.event
                        self.say("    /approve or /deny [note] to decide here")
                        return
        except RunbusError as exc:
            self.say(f"  error: {exc}")

    async def _record(self) -> SessionRecord | None:
        try:
            info = await self.client.call(ops.SESSIONS_GET, SessionGet(session_id=self.session_id))
        except RemoteError as exc:
            if exc.known_code == "not_found":
                return None
            raise
        return info.record

    async def history(self, args: list[str]) -> None:
        loaded = await self.client.call(ops.HISTORY_LOAD, HistoryLoad(session_id=self.session_id))
        for message in loaded.messages:
            self.say(transcript_line(message))
        if not loaded.messages:
            self.say("(no messages yet)")

    async def todos(self, args: list[str]) -> None:
        record = await self._record()
        try:
            state = todos.load(record.state.get(todos.STATE_KEY) if record else None)
        except msgspec.ValidationError as exc:
            self.say(f"the stored todo list is not readable: {exc}")
            return
        self.say(todos.render(state.items))

    async def mode(self, args: list[str]) -> None:
        if not args:
            record = await self._record()
            stored = record.state.get(modes.STATE_KEY) if record else None
            suffix = "" if stored else " (the agent's default)"
            self.say(f"mode: {modes.load(stored).mode}{suffix}")
            return
        wanted = args[0]
        if wanted not in modes.MODES or len(args) > 1:
            self.say(f"usage: /mode [{'|'.join(modes.MODES)}]")
            return
        for _ in range(MODE_ATTEMPTS):
            record = await self._record()
            if record is None:
                self.say("no session yet: send a message first")
                return
            current = modes.load(record.state.get(modes.STATE_KEY))
            changed = modes.host_set(current, wanted)
            if changed == current:
                self.say(f"mode: {current.mode} (unchanged)")
                return
            try:
                await self.client.call(
                    ops.SESSIONS_STATE_UPDATE,
                    SessionStateUpdate(
                        session_id=self.session_id,
                        key=modes.STATE_KEY,
                        value=modes.dump(changed),
                        expected_revision=record.revision,
                    ),
                )
            except RemoteError as exc:
                if exc.known_code == "conflict":
                    continue
                raise
            self.say(f"mode: {changed.mode} (the agent is told on its next run)")
            return
        self.say("the session kept changing; try again")

    async def memory(self, args: list[str]) -> None:
        try:
            listed = await self.client.call(ops.MEMORY_LIST, MemoryList(limit=20))
        except Unavailable:
            self.say("not available: this gateway does not offer memory.list")
            return
        for hit in listed.memories:
            self.say(f"- {hit.text}")
        if not listed.memories:
            self.say("(nothing remembered yet)")

    async def session(self, args: list[str]) -> None:
        match args:
            case []:
                self.say(f"session: {self.session_id}")
            case ["new"]:
                self.session_id = new_session_id()
                self.say(f"session: {self.session_id} (new)")
            case ["switch", session_id] if is_identifier(session_id):
                self.session_id = session_id
                self.say(f"session: {self.session_id}")
            case _:
                self.say("usage: /session, /session new, /session switch <id>")

    async def trace(self, args: list[str]) -> None:
        if self.last_trace_id is None:
            self.say("no run yet")
            return
        self.say(f"run {self.last_run_id}: trace {self.last_trace_id}")
        if self.jaeger_url:
            self.say(f"  {trace_link(self.jaeger_url, self.last_trace_id)}")
        else:
            self.say("  (set RUNBUS_JAEGER_URL to the Jaeger UI for a link)")

    async def approve(self, args: list[str]) -> None:
        await self._decide("approved", " ".join(args))

    async def deny(self, args: list[str]) -> None:
        await self._decide("denied", " ".join(args))

    async def _decide(self, decision: Literal["approved", "denied"], note: str) -> None:
        waiting = self.waiting
        if waiting is None:
            self.say("nothing waits for a decision")
            return
        decided = await self.client.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(
                run_id=waiting.run_id, call_id=waiting.call_id, decision=decision, note=note
            ),
        )
        self.waiting = None
        self.say(f"  {waiting.tool}: {decided.decision}")
        await self._follow(waiting.run_id)

    async def help(self, args: list[str]) -> None:
        self.say(HELP)


async def stdin_lines(prompt: str | None) -> AsyncIterator[str]:
    """Lines typed on standard input, until end of input."""
    while True:
        if prompt:
            sys.stdout.write(prompt)
            sys.stdout.flush()
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        yield line


def trace_link(ui_url: str, trace_id: str) -> str:
    """Jaeger's page of the trace, or `ui_url` with `{trace_id}` filled in (another trace UI)."""
    if "{trace_id}" in ui_url:
        return ui_url.replace("{trace_id}", trace_id)
    return f"{ui_url.rstrip('/')}/trace/{trace_id}"


def register(subparsers: Subparsers) -> None:
    chat = subparsers.add_parser("chat", help="talk to an agent in the terminal")
    chat.add_argument("--agent", default="travel", help="the agent to talk to (default travel)")
    chat.add_argument("--session", default=None, help="session id (default: a new one)")
    chat.add_argument(
        "--jaeger-url", default=None, help="Jaeger UI, for /trace links (RUNBUS_JAEGER_URL)"
    )
    chat.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for a run's next event (default 300)",
    )
    chat.set_defaults(handler=handle_chat)

    listing = subparsers.add_parser("todos", help="a session's todo list")
    listing.add_argument("session", help="the session whose todo list to show")
    listing.add_argument("--json", action="store_true", help="the stored list as JSON")
    listing.set_defaults(handler=handle_todos)


async def handle_chat(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        console = ChatConsole(
            RunbusClient(nc, token=settings.token),
            agent=args.agent,
            session_id=args.session or new_session_id(),
            out=sys.stdout,
            jaeger_url=args.jaeger_url or settings.jaeger_url or None,
            timeout=args.timeout,
        )
        await console.run(stdin_lines("> " if sys.stdin.isatty() else None))
    return 0


async def handle_todos(settings: Settings, args: argparse.Namespace) -> int:
    async with connected(settings) as nc:
        client = RunbusClient(nc, token=settings.token)
        info = await client.call(ops.SESSIONS_GET, SessionGet(session_id=args.session))
    state = todos.load(info.record.state.get(todos.STATE_KEY))
    if args.json:
        sys.stdout.write(msgspec.json.encode(todos.dump(state)).decode() + "\n")
    else:
        print(todos.render(state.items))
    return 0
