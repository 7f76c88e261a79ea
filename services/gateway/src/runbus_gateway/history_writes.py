"""A run's checkpoint stored straight into the history stream, without the history service.

The batch is the one the history service would store for the same append — same subject,
encoding and `Nats-Msg-Id` (`runbus.history_batches`) — so a retried or resumed append is
still stored once, and loads read it like any other. It is published only on the condition
that the session's stored history still ends at the sequence the run last saw
(`Nats-Expected-Last-Subject-Sequence`): the run opened and claimed that session for its
owner, and anything since — a purge by a delete, an import, another run's write — moved the
end, so the publish is refused and the append goes through the history service, which checks
the session's owner and incarnation again. A session with nothing stored yet (end 0) has no
end a delete could move: a batch of a run whose new session was deleted meanwhile is still
stored, but stamped with the incarnation the run opened, so no session made again under that
id reads it. A run that does not know its session's incarnation (one made before they were
kept) sends every append through the service.

A persisted compaction goes the same way, just before the checkpoint it comes with: stored on
the session's compactions subject on the condition that the session's messages still end at
the sequence the run last saw (`Nats-Expected-Last-Subject-Sequence-Subject` names the
messages' subject), so a deleted or imported session never gets it.
"""

import nats.errors
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError
from opentelemetry.trace import SpanKind

from runbus import subjects
from runbus.bus import Bus
from runbus.errors import Unavailable
from runbus.headers import (
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
    MSG_ID,
    RunContext,
)
from runbus.history_batches import (
    batch_id,
    compaction_id,
    compaction_to_store,
    messages_to_store,
)
from runbus.messages import ChatMessage
from runbus.messages.history import BATCH_ENCODER, HistoryCompaction, StoredBatch
from runbus.telemetry import messaging_attributes

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a publish whose expected last subject sequence did not hold."""


async def store_checkpoint(
    bus: Bus, ctx: RunContext, messages: list[ChatMessage], history_end: int, incarnation: str
) -> int | None:
    """Store `messages` for the session incarnation `incarnation`, after the session's batch
    `history_end` (0: on a session with nothing stored); where the session's history ends
    now, or None if the append must go through the history service (the end moved, or the
    batch was stored before: a retry)."""
    to_store, _ = messages_to_store(messages)
    if not to_store:
        return history_end
    subject = subjects.history_log(ctx.prop("tenant"), ctx.session_id)
    data = BATCH_ENCODER.encode(StoredBatch(messages=to_store, incarnation=incarnation))
    headers = {
        MSG_ID: batch_id(subject, to_store),
        EXPECTED_LAST_SUBJECT_SEQUENCE: str(history_end),
    }
    ack = await _publish(bus, ctx, subjects.HISTORY_LOG_TEMPLATE, subject, data, headers)
    return None if ack is None or ack.duplicate else ack.seq


async def store_compaction(
    bus: Bus, ctx: RunContext, compaction: HistoryCompaction, history_end: int, incarnation: str
) -> bool:
    """Store a persisted compaction for the session incarnation `incarnation`, whose stored
    messages end at `history_end`; False if they no longer do (the append must go through the
    history service). Stored before the messages of its append: a load takes the latest
    compaction, then what was stored after it."""
    stored = compaction_to_store(compaction, incarnation)
    tenant = ctx.prop("tenant")
    subject = subjects.history_compactions(tenant, ctx.session_id)
    headers = {
        MSG_ID: compaction_id(subject, stored),
        EXPECTED_LAST_SUBJECT_SEQUENCE: str(history_end),
        EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: subjects.history_log(tenant, ctx.session_id),
    }
    data = BATCH_ENCODER.encode(stored)
    template = subjects.HISTORY_COMPACTIONS_TEMPLATE
    return await _publish(bus, ctx, template, subject, data, headers) is not None


async def _publish(
    bus: Bus, ctx: RunContext, template: str, subject: str, data: bytes, headers: dict[str, str]
) -> PubAck | None:
    """The stream's ack, or None when the expected last sequence did not hold."""
    with bus.tracer.start_as_current_span(
        f"send {template}",
        kind=SpanKind.PRODUCER,
        attributes=messaging_attributes(subject, "send", message_size=len(data)),
    ):
        try:
            return await bus.stream_publish(subject, data, headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return None
            raise Unavailable(f"the history stream refused a checkpoint: {exc}") from None
        except (nats.errors.TimeoutError, NoStreamResponseError) as exc:
            raise Unavailable(
                f"the history stream did not confirm a checkpoint of run {ctx.run_id!r} "
                f"({type(exc).__name__})"
            ) from None
