"""Where a run stands and how it is saved: progress rebuilt from history on resume, the
group-committing checkpointer, and what history stores of a persisted compaction."""

import asyncio
from dataclasses import dataclass, field

from runbus.headers import RunContext
from runbus.messages import ChatMessage, FunctionCallContent
from runbus.messages.compaction import CompactResult
from runbus.messages.history import HistoryCompaction

from .run_ports import RunPorts


def message_id(run_id: str, part: str) -> str:
    """Id of a message a run makes: `<run_id>:<part>`. The colon cannot occur in a run id, so
    a run's own messages are found in history by prefix without matching another run's."""
    return f"{run_id}:{part}"


class Checkpointer:
    """Saves a run's new messages to history: one append per step, not one per message.

    What is added waits for the next `flush()` — which the loop awaits before a step's tool
    calls run, so the calls are stored before anything acts on them — or for `close()` at the
    end, which also releases the session. A step's tool results therefore travel with the next
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


@dataclass
class Progress:
    """Where a run stands: what it produced so far (also what a resumed run finds)."""

    step: int = 0
    response: list[ChatMessage] = field(default_factory=list)
    pending_calls: list[FunctionCallContent] = field(default_factory=list)
    finished: bool = False
    final_text: str | None = None
    """Set when the run ends on something other than an assistant answer (a terminate)."""

    @classmethod
    def from_history(cls, run_id: str, mine: list[ChatMessage]) -> "Progress":
        """Rebuild progress from this run's checkpointed messages (a redelivered run)."""
        progress = cls(response=[m for m in mine if m.role in ("assistant", "tool")])
        progress.step = sum(1 for m in progress.response if m.role == "assistant")
        if progress.response and progress.response[-1].role == "assistant":
            last = progress.response[-1]
            progress.pending_calls = last.function_calls
            progress.finished = not last.function_calls
        return progress


def persisted_compaction(result: CompactResult, run_id: str) -> HistoryCompaction | None:
    """What history stores of a compaction (`persist = true`): the compacted messages minus
    context-provider ones. None when it excluded a message of this run: a resumed run finds
    its own messages in history to continue after them, so they are never compacted away."""
    own = message_id(run_id, "")
    excluded = result.report.excluded_message_ids
    if not result.compacted or any(i.startswith(own) for i in excluded):
        return None
    return HistoryCompaction(
        messages=[m for m in result.messages if m.source != "context_provider"],
        excluded_message_ids=excluded,
    )
