"""How a run's messages are saved: the group-committing checkpointer."""

import asyncio

from runbus.headers import RunContext
from runbus.messages import ChatMessage
from runbus.messages.history import HistoryCompaction

from .ports import RunPorts


class Checkpointer:
    """Saves a run's new messages to history: one append per step, not one per message.

    What is added waits for the next `flush()` — which a step awaits before its tool calls
    run, so the calls are stored before anything acts on them — or for `close()` at the end,
    which also releases the session. A step's tool results therefore travel with the next
    step's model reply. Results that must not wait (`urgent`: tools run inside the gateway,
    whose effects are not recorded by call id) start a background append at once; the others
    came from the tool executor, which records each call's result under its call id, so a run
    resumed before they were stored gets the recorded results again, nothing acts twice.
    """

    def __init__(self, ports: RunPorts, ctx: RunContext) -> None:
        self._ports = ports
        self._ctx = ctx
        self._pending: list[ChatMessage] = []
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
                batch, self._pending = self._pending, []
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

    async def close(self, history_length: int | None) -> None:
        """Write what is pending and release the session's claim, in one append."""
        if self._writer is not None:
            await self._writer
        if self._error is not None:
            raise self._error
        batch, self._pending = self._pending, []
        compaction, self._compaction = self._compaction, None
        self.history_end = await self._ports.append_history(
            self._ctx,
            batch,
            release=True,
            history_length=history_length,
            compaction=compaction,
            history_end=self.history_end,
            incarnation=self.incarnation,
        )
