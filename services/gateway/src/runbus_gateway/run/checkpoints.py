"""How a run's messages are saved: checkpoints in the run's own events while it runs, one
history append when it ends."""

import asyncio
from typing import Final

from runbus.headers import RunContext
from runbus.messages import ChatMessage
from runbus.messages.history import BATCH_ENCODER, HistoryCompaction

from .ports import RunPorts

APPEND_BYTES: Final = 128 * 1024
"""What a run may hold back from history before it appends it during the run (one append
must fit in a message, and so must the run's last)."""


class Checkpointer:
    """Saves a run's new messages: each step's checkpoint rides on an event the step publishes
    anyway, and history gets them in one append at the end.

    Before a step's tool calls run, `checkpoint()` hands over what the run produced since its
    last checkpoint (the run's input, the previous step's tool results, this step's reply with
    its calls): the step's first `run.tool_call` event carries it, and the step waits until
    the events stream stored it — so the calls are stored before anything acts on them, at no
    stored write of their own. A resumed run reads them back from its events
    (`RunState.load`). `close()` at the end appends everything to history in one batch and
    releases the session; a run whose held-back messages outgrow APPEND_BYTES appends them
    earlier. Results that must not wait (`urgent`: tools run inside the gateway, whose effects
    are not recorded by call id) start a background append at once; the others came from the
    tool executor, which records each call's result under its call id, so a run resumed before
    they were stored gets the recorded results again, nothing acts twice.
    """

    def __init__(self, ports: RunPorts, ctx: RunContext) -> None:
        self._ports = ports
        self._ctx = ctx
        self._pending: list[ChatMessage] = []
        """What history has not got yet, in order."""
        self._carried = 0
        """How many of `_pending`, from the front, a stored event already carries."""
        self._compaction: HistoryCompaction | None = None
        self._persisted: set[str] = set()
        """Ids excluded by the compactions persisted so far in this run."""
        self._writer: asyncio.Task[None] | None = None
        self._error: Exception | None = None
        self.history_end: int | None = None
        """Stream sequence of the session's last stored batch as this run knows it (set from
        the session as opened, then from each append): a checkpoint is stored directly only
        if the session's history still ends there, so it never lands after a write it has
        not seen (a deleted session, someone else's)."""
        self.incarnation = ""
        """The session's incarnation as the run opened it: the checkpoints are stored for it
        (a session deleted and made again under the same id meanwhile never reads them)."""

    def add(self, messages: list[ChatMessage], *, urgent: bool = False) -> None:
        """Queue `messages` for the next append; `urgent` starts it now, in the background."""
        self._pending.extend(messages)
        if urgent:
            self._start()

    def resume(self, messages: list[ChatMessage]) -> None:
        """Messages a resumed run found in its events only: history gets them with the next
        append; no checkpoint needs to carry them again."""
        self._pending.extend(messages)
        self._carried = len(self._pending)

    async def checkpoint(self) -> list[ChatMessage]:
        """What the run produced since its last checkpoint, for the step's first tool-call
        event to carry; the caller has it stored before the step's calls run. Whatever history
        has not got yet is appended first if it outgrew APPEND_BYTES (then nothing is left to
        carry)."""
        if self._writer is not None:
            await self._writer
        if self._error is not None:
            raise self._error
        if sum(len(BATCH_ENCODER.encode(m)) for m in self._pending) > APPEND_BYTES:
            await self.flush()
        fresh = self._pending[self._carried :]
        self._carried = len(self._pending)
        return fresh

    def persist(self, compaction: HistoryCompaction) -> bool:
        """Store `compaction` after the messages added so far, unless it excludes nothing new
        (the same window, one step later); a newer one pending replaces an older one. True
        when it will be stored."""
        if self._persisted.issuperset(compaction.excluded_message_ids):
            return False
        self._persisted.update(compaction.excluded_message_ids)
        self._compaction = compaction
        return True

    def _start(self) -> None:
        if self._error is None and (self._writer is None or self._writer.done()):
            self._writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        try:
            while self._pending or self._compaction is not None:
                batch, self._pending, self._carried = self._pending, [], 0
                compaction, self._compaction = self._compaction, None
                self.history_end = await self._ports.append_history(
                    self._ctx,
                    batch,
                    compaction=compaction,
                    history_end=self.history_end,
                    incarnation=self.incarnation,
                )
        except Exception as exc:
            self._error = exc

    async def flush(self) -> None:
        """Store everything added so far (one append, after any in flight)."""
        self._start()
        if self._writer is not None:
            await self._writer
        if self._error is not None:
            raise self._error

    async def close(self, history_length: int | None, *, finished: bool = False) -> None:
        """Write what is pending and release the session's claim, in one append; `finished`:
        the run's answer is next (its messages are marked closed, `HistoryAppend.closes`)."""
        if self._writer is not None:
            await self._writer
        if self._error is not None:
            raise self._error
        batch, self._pending, self._carried = self._pending, [], 0
        compaction, self._compaction = self._compaction, None
        self.history_end = await self._ports.append_history(
            self._ctx,
            batch,
            release=True,
            history_length=history_length,
            compaction=compaction,
            history_end=self.history_end,
            incarnation=self.incarnation,
            closes=finished,
        )
