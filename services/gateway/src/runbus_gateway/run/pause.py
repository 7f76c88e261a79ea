"""A run's step boundaries: where its owner's pause (`runs.pause`) stops it — before a model
call, and after a model reply before its calls run — until `runs.resume`, with the edits made
meanwhile. The wait is an approval's: the run's slot is lent out, its delivery kept."""

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import jsonschema
import msgspec

from runbus.errors import BadRequest, Conflict
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    RunPaused,
    RunResumed,
    TextContent,
    ToolSpec,
)
from runbus.messages.runs import RunEdit, RunPending
from runbus.owners import Owner

from .events import RunEvents
from .late import hand_back_if_late
from .state import message_id

MAX_ADDED: Final = 16
"""Messages one pause may add."""


Status = Literal["requested", "paused", "resumed"]


class PauseRecord(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    tenant: str
    user_id: str
    """Owner of the run: the one person who may pause, edit or resume it."""
    status: Status = "requested"
    generation: int = 1
    """Which pause of the run it is (each `runs.pause` after a resume starts the next)."""
    step: int = 0
    """Model replies stored before the pause."""
    reply: ChatMessage | None = None
    """The model's reply whose calls have not run (as edited), not stored yet; None when the
    run paused before a model call."""
    added: list[ChatMessage] = []
    """User messages the owner added, read by the model after the pending calls' results."""
    tools: list[ToolSpec] = []
    """The run's tools the reply calls: their schemas check an edit's arguments."""
    requested_at: float = 0.0
    paused_at: float = 0.0
    attempt: int = 0
    """The latest delivery of the run that started (written by each delivery after the
    first, `Pauses.fence`): an earlier delivery still going — cut off by a partition or a
    pause, and given up on by the server — stops at its next boundary (`Superseded`)."""

    @property
    def asked(self) -> bool:
        """A pause was asked for (a record that only fences deliveries has none)."""
        return self.generation > 0

    def pending(self) -> RunPending:
        return RunPending(
            run_id=self.run_id,
            status=self.status,
            step=self.step,
            calls=self.calls,
            messages=[*([self.reply] if self.reply is not None else []), *self.added],
            tools=self.tools,
        )

    @property
    def calls(self) -> list[FunctionCallContent]:
        return [] if self.reply is None else self.reply.function_calls


class Superseded(Exception):
    """This delivery of the run was given up on by the server (cut off, paused) and a later
    one took the run over: it stops where it stands and writes nothing more — no history, no
    ending, no ack. The later one goes on from what is stored."""

    def __init__(self, run_id: str, attempt: int, latest: int) -> None:
        super().__init__(f"run {run_id!r}: delivery {attempt} was superseded by delivery {latest}")
        self.run_id = run_id
        self.attempt = attempt
        self.latest = latest


def check_current(record: PauseRecord | None, run_id: str, attempt: int) -> None:
    """`Superseded` if a later delivery of the run than `attempt` has started."""
    if record is not None and record.attempt > attempt:
        raise Superseded(run_id, attempt, record.attempt)


class NotPaused(Conflict):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is not paused ({status})")
        self.run_id = run_id
        self.status = status


class InvalidEdit(BadRequest):
    """An edit the run cannot take; the run stays paused as it was."""

    def __init__(self, call_id: str, problem: str) -> None:
        super().__init__(f"call {call_id!r}: {problem}" if call_id else problem)
        self.call_id = call_id
        self.problem = problem


def edited(record: PauseRecord, edit: RunEdit) -> PauseRecord:
    """`record` with `edit` applied, every change checked first: arguments against the tool's
    schema (as the model's are), ids against the pending calls. `InvalidEdit` otherwise."""
    calls = {c.call_id: c for c in record.calls}
    for call_id in [*(c.call_id for c in edit.replace), *edit.drop]:
        if call_id not in calls:
            raise InvalidEdit(call_id, "no such pending call")
    if len(record.added) + len(edit.add) > MAX_ADDED:
        raise InvalidEdit("", f"a pause adds at most {MAX_ADDED} messages")
    schemas = {t.name: t.parameters for t in record.tools}
    replaced: dict[str, FunctionCallContent] = {}
    for change in edit.replace:
        call = calls[change.call_id]
        problem = schema_problem(schemas.get(call.name), change.arguments)
        if problem is not None:
            raise InvalidEdit(change.call_id, f"arguments for {call.name!r}: {problem}")
        replaced[call.call_id] = msgspec.structs.replace(call, arguments=change.arguments)
    reply = record.reply
    if reply is not None:
        contents = [
            replaced.get(c.call_id, c) if isinstance(c, FunctionCallContent) else c
            for c in reply.contents
            if not (isinstance(c, FunctionCallContent) and c.call_id in edit.drop)
        ]
        reply = msgspec.structs.replace(reply, contents=contents)
    added = [
        *record.added,
        *(
            ChatMessage(
                role="user",
                contents=[TextContent(text=text)],
                message_id=f"{record.run_id}:note{record.generation}.{len(record.added) + i}",
            )
            for i, text in enumerate(edit.add)
        ),
    ]
    return msgspec.structs.replace(record, reply=reply, added=added)


def schema_problem(schema: dict[str, object] | None, arguments: dict[str, object]) -> str | None:
    """Why `arguments` do not meet `schema`; None when they do (or there is no schema)."""
    if not schema:
        return None
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    except jsonschema.exceptions.SchemaError:
        return None  # the tool's own schema is broken: the tool checks what it gets
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{error.message} at /{where}" if where else error.message


class PauseStore(Protocol):
    """Where pauses are kept (`runbus_gateway.pauses`, a KV bucket)."""

    async def get(self, owner: Owner, run_id: str) -> PauseRecord | None: ...

    async def reach(
        self,
        owner: Owner,
        run_id: str,
        step: int,
        reply: ChatMessage | None,
        tools: Sequence[ToolSpec],
    ) -> PauseRecord | None: ...

    async def wait(self, owner: Owner, run_id: str) -> PauseRecord: ...


OnPaused = Callable[[bool], Awaitable[None]]
"""Told when the run pauses (True) and goes on (False): its status and slot follow."""


@dataclass(frozen=True)
class Held:
    """What a pause gave back: the model's reply to go on with (None: ask the model), and the
    messages its owner added (read after the reply's results)."""

    reply: ChatMessage | None
    added: list[ChatMessage] = field(default_factory=list)


@dataclass(frozen=True)
class PausePoint:
    """The pause hook of one run (`LocalRun` builds it)."""

    pauses: PauseStore
    owner: Owner
    on_paused: OnPaused
    attempt: int = 1
    """This delivery's number: a later one's start stops this one (`Superseded`)."""

    async def current(self, run_id: str) -> None:
        """`Superseded` if a later delivery took the run over: asked before the step's calls
        run (their events stored first) and before the run's history is closed, where a
        delivery the server gave up on would act twice or write over the later one's."""
        check_current(await self.pauses.get(self.owner, run_id), run_id, self.attempt)

    async def at(
        self,
        events: RunEvents,
        step: int,
        reply: ChatMessage | None,
        tools: Sequence[ToolSpec],
        flush: Callable[[], Awaitable[None]],
        recorded: Collection[str] = (),
    ) -> Held | None:
        """The run is at a boundary: None to go on as it would, or what it goes on with after
        a pause. Before a model call (`reply` None), a pause that stood when the run was
        redelivered gives back the reply it held, so the model is not asked again. `flush`
        stores what the run made so far, before it pauses (one read per boundary otherwise);
        `recorded`: ids of the messages the run has made so far."""
        run_id = events.run_id
        found = await self.pauses.get(self.owner, run_id)
        check_current(found, run_id, self.attempt)
        if found is None:
            return None
        if found.status == "resumed":
            # Resumed, but the run stopped before it stored what it was resumed with.
            if reply is not None:
                return None
            kept = _kept(found.reply)
            if kept is not None:
                if kept.message_id == message_id(run_id, f"m{step}"):
                    return Held(kept, found.added)
                return None
            if found.added and not any(m.message_id in recorded for m in found.added):
                return Held(None, found.added)
            return None
        # A paused run may wait for hours, and one redelivered meanwhile goes on from what
        # is stored.
        await flush()
        record = await self.pauses.reach(self.owner, run_id, step, reply, tools)
        if record is None:
            return None
        paused = RunPaused(run_id=run_id, step=record.step, calls=record.calls)
        await events.port.emit(events.ctx, paused, event_id=f"paused-{record.generation}")
        await self.on_paused(True)
        try:
            resumed = await self.pauses.wait(self.owner, run_id)
        finally:
            await self.on_paused(False)
        held = Held(_kept(resumed.reply), resumed.added)
        calls: list[FunctionCallContent] = held.reply.function_calls if held.reply else []
        event = RunResumed(run_id=run_id, calls=calls)
        await events.port.emit(events.ctx, event, event_id=f"resumed-{record.generation}")
        # Another delivery goes on from the pause if this one used up its deadline (the
        # reply and notes are in the record, `resumed`).
        hand_back_if_late(events.ctx, "its pause")
        return held


def _kept(reply: ChatMessage | None) -> ChatMessage | None:
    """A reply whose calls were all dropped is not kept: the model is asked again."""
    return reply if reply is not None and reply.function_calls else None
