"""A person steps into their own run on the client API: pause it at a step boundary, read and
edit what is pending, resume it (`pauses.py`), or fork it from one of its checkpoints into a
new session (time travel). Every operation finds the run under the caller: another owner's run
id is `not_found`."""

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

import msgspec
import structlog

from runbus import ops
from runbus.bus import Bus
from runbus.errors import BadRequest, Conflict, NotFound
from runbus.headers import RunContext
from runbus.messages.runs import (
    RunCheckpoint,
    RunEdit,
    RunFork,
    RunForked,
    RunPause,
    RunPending,
    RunPendingGet,
    RunRecord,
    RunResume,
)
from runbus.messages.sessions import SessionDocument, SessionExport, SessionImport
from runbus.owners import Owner
from runbus.tokens import Principal

from .agents import AgentSpec
from .pauses import Pauses
from .run.pause import NotPaused
from .runs import RunRecords

log = structlog.get_logger()

PAUSABLE: Final = frozenset({"queued", "running", "waiting_approval", "paused"})
"""Statuses of a run that has a next step boundary to pause at (or is paused)."""


class NotPausable(Conflict):
    """A run of a program agent: its program answers in one go, with no step to stop at."""

    def __init__(self, run_id: str, agent: str) -> None:
        super().__init__(
            f"run {run_id!r} is of program agent {agent!r}, which has no step boundary to "
            "pause at; cancel it instead"
        )
        self.run_id = run_id


class RunControl:
    def __init__(
        self,
        bus: Bus,
        records: RunRecords,
        pauses: Pauses,
        agents: Mapping[str, AgentSpec] | None = None,
    ) -> None:
        self.bus = bus
        self.records = records
        self.pauses = pauses
        self.agents = agents or {}

    async def _record(self, principal: Principal, run_id: str) -> RunRecord:
        record = await self.records.get(principal.tenant, principal.user_id, run_id)
        if record is None:
            raise NotFound(f"no run {run_id!r}")
        return record

    async def pause(self, principal: Principal, request: RunPause) -> RunPending:
        """Ask the caller's run to pause at its next step boundary."""
        record = await self._live(principal, request.run_id)
        agent = self.agents.get(record.agent)
        if agent is not None and agent.harness.kind == "program":
            raise NotPausable(request.run_id, record.agent)
        owner = Owner(principal.tenant, principal.user_id)
        pause = await self.pauses.request(owner, request.run_id)
        log.info("run_pause_requested", run_id=request.run_id, generation=pause.generation)
        return pause.pending()

    async def _live(self, principal: Principal, run_id: str) -> RunRecord:
        """The caller's run, unless it has ended (a pause of an ended run is over)."""
        record = await self._record(principal, run_id)
        if record.status not in PAUSABLE:
            raise NotPaused(run_id, record.status)
        return record

    async def pending(self, principal: Principal, request: RunPendingGet) -> RunPending:
        record = await self._live(principal, request.run_id)
        pause = await self.pauses.get(Owner(principal.tenant, principal.user_id), record.run_id)
        if pause is None or not pause.asked:
            raise NotPaused(request.run_id, record.status)
        return pause.pending()

    async def edit(self, principal: Principal, request: RunEdit) -> RunPending:
        """Change the paused run's pending step; it stays paused."""
        record = await self._live(principal, request.run_id)
        owner = Owner(principal.tenant, principal.user_id)
        pause = await self.pauses.edit(owner, record.run_id, request)
        log.info(
            "run_edited",
            run_id=request.run_id,
            replaced=len(request.replace),
            dropped=len(request.drop),
            added=len(request.add),
        )
        return pause.pending()

    async def resume(self, principal: Principal, request: RunResume) -> RunPending:
        record = await self._live(principal, request.run_id)
        pause = await self.pauses.resume(Owner(principal.tenant, principal.user_id), record.run_id)
        log.info("run_resumed", run_id=request.run_id, generation=pause.generation)
        return pause.pending()

    async def fork(self, principal: Principal, ctx: RunContext, request: RunFork) -> RunForked:
        """A new session of the caller's: the run's session as stored up to the checkpoint
        (the history the run started from, then the run's first `checkpoint` messages), its
        messages as they are, byte for byte, and its state bag as it is now."""
        record = await self._record(principal, request.run_id)
        exported = await self.bus.call(
            ops.SESSIONS_EXPORT, SessionExport(session_id=record.session_id), ctx=ctx
        )
        document, checkpoints, kept = cut(exported.document, request)
        await self.bus.call(ops.SESSIONS_IMPORT, SessionImport(document=document), ctx=ctx)
        log.info(
            "run_forked",
            run_id=request.run_id,
            session_id=request.session_id,
            checkpoint=kept,
            messages=len(document.messages),
        )
        return RunForked(
            run_id=request.run_id,
            session_id=request.session_id,
            checkpoint=kept,
            messages=len(document.messages),
            checkpoints=checkpoints,
        )


def cut(
    document: SessionDocument, request: RunFork
) -> tuple[SessionDocument, list[RunCheckpoint], int]:
    """The document of the fork: `document` up to the run's checkpoint, as a new session;
    the run's checkpoints; the one kept. Checkpoint n ends with the run's n-th stored message
    (0: the history before its first)."""
    own = f"{request.run_id}:"
    positions = [i for i, m in enumerate(document.messages) if m.message_id.startswith(own)]
    checkpoints = [
        RunCheckpoint(
            checkpoint=n,
            message_id=document.messages[i].message_id,
            role=document.messages[i].role,
        )
        for n, i in enumerate(positions, start=1)
    ]
    if not positions:
        raise NotFound(f"run {request.run_id!r} stored no messages to fork from")
    kept = len(positions) if request.checkpoint is None else request.checkpoint
    if kept > len(positions):
        raise BadRequest(
            f"run {request.run_id!r} has checkpoints 0 to {len(positions)}, not {kept}"
        )
    end = positions[0] if kept == 0 else positions[kept - 1] + 1
    messages = document.messages[:end]
    ids = {m.message_id for m in messages}
    stamp = datetime.now(UTC)
    forked = msgspec.structs.replace(
        document,
        record=msgspec.structs.replace(
            document.record,
            session_id=request.session_id,
            created_at=stamp,
            updated_at=stamp,
            history_length=len(messages),
            active_run=None,
            claim_expires=None,
            revision=0,
            incarnation="",
        ),
        messages=messages,
        compactions=[
            c
            for c in document.compactions
            if c.after <= end and ids.issuperset(c.compaction.excluded_message_ids)
        ],
        abandoned_runs=[
            r for r in document.abandoned_runs if any(i.startswith(f"{r}:") for i in ids)
        ],
    )
    return forked, checkpoints, kept
