"""Agents that are not chat models: a Python class (a rule engine, a workflow, a state machine)
served by the same run contract — same subject, events, history, state bag and traces.

    [harness]
    kind = "program"
    program = "runbus_examples.refund:RefundPolicyAgent"
    program_options = {window_days = 30}

The class is built once at start with `program_options` as keyword arguments; each run calls
`respond` with the run's inputs, the loaded history, context messages and the state bag.
"""

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

import msgspec

from runbus.messages import ChatMessage, TextContent

from ..errors import GatewayConfigError
from ..type_paths import load_type
from .errors import ProgramError
from .state import SessionState

STATE_KEY: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")


@dataclass(frozen=True)
class ProgramRun:
    """Everything a program agent may look at; it must not change any of it."""

    run_id: str
    session_id: str
    agent: str
    user_id: str
    """The caller, from the verified credential."""
    tenant: str
    inputs: list[ChatMessage]
    """This run's user messages."""
    history: list[ChatMessage]
    """The session's earlier messages, oldest first (stamped `chat_history`)."""
    state: Mapping[str, Any]
    """The session's state bag."""
    context: list[ChatMessage] = field(default_factory=list)
    """Messages context providers made for this run (recalled memories, …)."""

    @property
    def text(self) -> str:
        """The user's text in this run."""
        return "\n".join(m.text for m in self.inputs if m.text)


class ProgramReply(msgspec.Struct, kw_only=True, frozen=True):
    messages: list[ChatMessage]
    """Assistant messages to emit and store, in order; the last one's text is the answer."""
    state: dict[str, Any] = {}
    """State bag changes: key → new JSON value (None removes the key)."""


@runtime_checkable
class ProgramAgent(Protocol):
    async def respond(self, run: ProgramRun) -> ProgramReply:
        """Answer one run. Raising fails the run like any other failure."""
        ...


def say(*texts: str) -> ChatMessage:
    """An assistant message with the given text."""
    return ChatMessage(role="assistant", contents=[TextContent(text="".join(texts))])


def load_program(path: str, options: Mapping[str, Any] | None = None) -> ProgramAgent:
    """The program agent `module:Class`, built with `options`; `GatewayConfigError` says what
    is wrong with the path, the import, the class or the options."""
    cls = load_type(path, "program")
    if not inspect.iscoroutinefunction(getattr(cls, "respond", None)):
        raise GatewayConfigError(f"program {path!r}: the class has no `async def respond(run)`")
    try:
        program = cls(**dict(options or {}))
    except (TypeError, ValueError) as exc:
        raise GatewayConfigError(f"program {path!r}: bad program_options: {exc}") from None
    assert isinstance(program, ProgramAgent)
    return program


async def run_program(
    program: ProgramAgent, name: str, run: ProgramRun, state: SessionState
) -> list[ChatMessage]:
    """Call the program, check what it returned, store its state changes (compare-and-set)
    and return its messages, ready for the caller to stamp ids on, emit and checkpoint."""
    reply = await program.respond(run)
    if not isinstance(reply, ProgramReply):
        raise ProgramError(name, f"respond() returned {type(reply).__name__}, not ProgramReply")
    if not reply.messages:
        raise ProgramError(name, "respond() returned no message")
    for message in reply.messages:
        if message.role != "assistant" or message.function_calls:
            raise ProgramError(name, "a program answers with assistant messages without calls")
    for key in reply.state:
        if not STATE_KEY.match(key):
            raise ProgramError(name, f"state key {key[:80]!r} is not a valid key")
    for key, value in reply.state.items():
        await state.change(key, _replace_with(value))
    return [msgspec.structs.replace(m, source="external") for m in reply.messages]


def _replace_with(value: Any) -> Callable[[Any], tuple[Any, None]]:
    def replace(_current: Any) -> tuple[Any, None]:
        return value, None

    return replace
