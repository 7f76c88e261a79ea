"""History rules without a bus: what to store, how loaded history is repaired and stamped,
who may see a session, how a run claims one."""

import secrets
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from runbus import session_ids
from runbus.messages import ChatMessage, FunctionResultContent
from runbus.messages.history import REPAIR_SUFFIX, HistoryCompaction, StoredBatch
from runbus.messages.sessions import ConcurrencyPolicy, SessionRecord, StoredCompaction

from .errors import SessionBusy, SessionNotFound

RecordChange = Callable[[SessionRecord], SessionRecord]
"""A pure change to a session record, re-applied on the latest revision if a write races."""

ORPHAN_CALL_ERROR = "not executed: the run stopped before this call returned a result"
COMPACTION_DECODER = msgspec.json.Decoder(HistoryCompaction)
RECORD_DECODER = msgspec.json.Decoder(SessionRecord)
_ENCODER = msgspec.json.Encoder()


def new_incarnation() -> str:
    """The incarnation of a session made now (`SessionRecord.incarnation`)."""
    return secrets.token_hex(8)


def of_incarnation(stamp: str, incarnation: str) -> bool:
    """Whether what was stored with `stamp` belongs to the session incarnation `incarnation`.

    Exactly: what was stored with no stamp belongs only to a session made before incarnations
    were kept (whose record has none either, and whose writes are never stamped). So nothing a
    deleted session of the same id left behind, stamped or not, is ever part of a session made
    since, and opening a new session need not read what is stored under its id first."""
    return stamp == incarnation


def appendable(record: SessionRecord, incarnation: str) -> bool:
    """Whether a run that opened the session's incarnation `incarnation` (empty: unknown) may
    still append to `record`: not once the session it opened was deleted and made again.
    What it appends is stamped with the record's incarnation either way."""
    return not incarnation or incarnation == record.incarnation


def loaded(
    batches: list[StoredBatch],
    compaction: HistoryCompaction | None = None,
    incarnation: str = "",
    *,
    abandoned: bool = False,
) -> list[ChatMessage]:
    """The history of the session incarnation `incarnation` in order, each id once, stamped
    `chat_history`: the persisted compaction's messages (if any) then the batches stored
    after it for that incarnation, minus what it excluded and, unless `abandoned` (audit),
    minus the messages of runs that failed for good (`StoredBatch.abandoned_run`)."""
    seen: set[str] = set(compaction.excluded_message_ids) if compaction else set()
    out: list[ChatMessage] = []
    mine = [b for b in batches if of_incarnation(b.incarnation, incarnation)]
    parts = [b.messages for b in mine]
    if compaction is not None:
        parts.insert(0, compaction.messages)
    failed = () if abandoned else tuple(f"{run}:" for run in abandoned_runs(mine, incarnation))
    for messages in parts:
        for message in messages:
            if message.message_id in seen or (failed and message.message_id.startswith(failed)):
                continue
            seen.add(message.message_id)
            out.append(msgspec.structs.replace(message, source="chat_history"))
    return out


def document_history(
    batches: list[tuple[int, StoredBatch]],
    compactions: list[tuple[int, HistoryCompaction]],
    incarnation: str = "",
) -> tuple[list[ChatMessage], list[StoredCompaction]]:
    """Every original stored for the session incarnation `incarnation` in order (each id
    once, stamped `chat_history`, as a load stamps them) and each of its persisted
    compactions placed after the originals stored before it (by stream sequence): a session
    document (its abandoned runs: `abandoned_runs`)."""
    messages: list[ChatMessage] = []
    placed: list[StoredCompaction] = []
    seen: set[str] = set()
    batches = [(s, b) for s, b in batches if of_incarnation(b.incarnation, incarnation)]
    compactions = [(s, c) for s, c in compactions if of_incarnation(c.incarnation, incarnation)]
    pending = iter(sorted(compactions, key=lambda c: c[0]))
    upcoming = next(pending, None)
    for sequence, batch in [*batches, (None, None)]:
        while upcoming is not None and (sequence is None or upcoming[0] < sequence):
            # A document belongs to no incarnation: an import makes a new one.
            compaction = msgspec.structs.replace(upcoming[1], incarnation="")
            placed.append(StoredCompaction(after=len(messages), compaction=compaction))
            upcoming = next(pending, None)
        if batch is None:
            break
        for message in batch.messages:
            if message.message_id not in seen:
                seen.add(message.message_id)
                messages.append(msgspec.structs.replace(message, source="chat_history"))
    return messages, placed


def abandoned_runs(batches: list[StoredBatch], incarnation: str = "") -> list[str]:
    """The runs `batches` mark as failed for good, for the session incarnation `incarnation`:
    not one that also closed its history (`StoredBatch.closed_run`), whichever came first —
    the marker is then an attempt's that lost the race to the one that finished the run."""
    mine = [b for b in batches if of_incarnation(b.incarnation, incarnation)]
    closed = {b.closed_run for b in mine if b.closed_run}
    return [b.abandoned_run for b in mine if b.abandoned_run and b.abandoned_run not in closed]


def document_chunks(
    messages: list[ChatMessage], compactions: list[StoredCompaction], chunk: int
) -> list[list[ChatMessage] | HistoryCompaction]:
    """What an import writes, in order: the messages in chunks of at most `chunk`, each
    compaction right after the messages stored before it."""
    out: list[list[ChatMessage] | HistoryCompaction] = []
    start = 0
    for stop, compaction in [
        *((c.after, c.compaction) for c in compactions),
        (len(messages), None),
    ]:
        stop = min(max(stop, start), len(messages))
        out.extend(messages[i : min(i + chunk, stop)] for i in range(start, stop, chunk))
        start = stop
        if compaction is not None:
            out.append(compaction)
    return out


def chunks_of_size(messages: list[ChatMessage], budget: int) -> list[list[ChatMessage]]:
    """`messages` in order, in chunks of at most `budget` encoded bytes (a larger message
    alone in its chunk)."""
    out: list[list[ChatMessage]] = []
    size = 0
    for message in messages:
        length = len(_ENCODER.encode(message))
        if not out or size + length > budget:
            out.append([])
            size = 0
        out[-1].append(message)
        size += length
    return out


def repair(messages: list[ChatMessage]) -> list[ChatMessage]:
    """A history a provider accepts: every function call answered, no result without its call.

    A run that crashed, was cancelled or terminated can leave an assistant message whose calls
    have no results; each orphan call gets a synthetic error result right after its message.
    Results whose call is nowhere are dropped.
    """
    calls = {c.call_id for m in messages for c in m.function_calls}
    answered = {r.call_id for m in messages for r in m.function_results}
    out: list[ChatMessage] = []
    for message in messages:
        if message.role == "tool":
            kept = [
                c
                for c in message.contents
                if not isinstance(c, FunctionResultContent) or c.call_id in calls
            ]
            if kept:
                out.append(
                    message
                    if len(kept) == len(message.contents)
                    else msgspec.structs.replace(message, contents=kept)
                )
            continue
        out.append(message)
        orphans = [c for c in message.function_calls if c.call_id not in answered]
        if orphans:
            out.append(
                ChatMessage(
                    role="tool",
                    contents=[
                        FunctionResultContent(call_id=c.call_id, error=ORPHAN_CALL_ERROR)
                        for c in orphans
                    ],
                    message_id=message.message_id + REPAIR_SUFFIX,
                    created_at=message.created_at,
                    source="chat_history",
                )
            )
    return out


def window_start(messages: list[ChatMessage], sizes: list[int], budget: int) -> int:
    """Where the window a load keeps of `messages` starts: the last whole turns (a turn starts
    at a user message) whose `sizes` add up to at most `budget`, and at least the last turn
    however large. 0 when no earlier message can be left out."""
    total, start = 0, len(messages)
    for index in range(len(messages) - 1, -1, -1):
        total += sizes[index]
        if messages[index].role == "user":
            if total > budget and start < len(messages):
                break
            start = index
    return start if start < len(messages) else 0


def last_turns(messages: list[ChatMessage], turns: int | None) -> list[ChatMessage]:
    """The last `turns` turns (a turn starts at a user message), whole; everything if None."""
    if turns is None:
        return messages
    starts = [i for i, m in enumerate(messages) if m.role == "user"]
    if len(starts) <= turns:
        return messages
    return messages[starts[-turns] :] if turns > 0 else []


def owned(record: SessionRecord | None, user_id: str, session_id: str) -> SessionRecord:
    """The record if `user_id` owns it; otherwise the same `not_found` as a missing one."""
    if record is None or record.owner != user_id:
        raise SessionNotFound(session_id)
    return record


def check_creatable(session_id: str, tenant: str, user_id: str) -> None:
    """`not_found` for a session id scoped to another user (`runbus.session_ids`): whoever
    creates a session holds it, and such an id is that user's alone, however it arrives."""
    if session_ids.foreign(session_id, tenant, user_id):
        raise SessionNotFound(session_id)


def live_run(record: SessionRecord, now: float) -> str | None:
    """The run holding the session now, if any (a claim past its expiry is stale)."""
    holder = record.active_run
    if holder is None or (record.claim_expires is not None and record.claim_expires <= now):
        return None
    return holder


def claim(
    record: SessionRecord,
    run_id: str,
    deadline: float | None,
    policy: ConcurrencyPolicy,
    now: float,
) -> tuple[SessionRecord, str | None]:
    """The record claimed by `run_id`, and the run it displaces (policy `interrupt`).

    Raises `SessionBusy` when another live run holds it and the policy is not `interrupt`
    (for `enqueue` the caller waits and tries again). A claim past its expiry is stale.
    """
    holder = live_run(record, now)
    displaced: str | None = None
    if holder is not None and holder != run_id:
        if policy != "interrupt":
            raise SessionBusy(record.session_id, holder)
        displaced = holder
    claimed = msgspec.structs.replace(
        record,
        active_run=run_id,
        claim_expires=deadline,
        updated_at=datetime.fromtimestamp(now, UTC),
    )
    return claimed, displaced


def released(
    record: SessionRecord, run_id: str, history_length: int | None, now: datetime
) -> SessionRecord:
    """The record after `run_id` finished: claim cleared if it still held it, length updated."""
    changes: dict[str, object] = {"updated_at": now}
    if record.active_run == run_id:
        changes.update(active_run=None, claim_expires=None)
    if history_length is not None:
        changes["history_length"] = history_length
    return msgspec.structs.replace(record, **changes)
