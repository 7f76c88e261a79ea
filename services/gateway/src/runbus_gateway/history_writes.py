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
id reads it (and the next one made purges it). A run that does not know its session's
incarnation (one made before they were kept) sends its first append through the service.
"""

import nats.errors
from nats.js.errors import APIError, NoStreamResponseError
from opentelemetry.trace import SpanKind

from runbus import subjects
from runbus.bus import Bus
from runbus.errors import Unavailable
from runbus.headers import EXPECTED_LAST_SUBJECT_SEQUENCE, MSG_ID, RunContext
from runbus.history_batches import batch_id, messages_to_store
from runbus.messages import ChatMessage
from runbus.messages.history import BATCH_ENCODER, StoredBatch
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
    with bus.tracer.start_as_current_span(
        f"send {subjects.HISTORY_LOG_TEMPLATE}",
        kind=SpanKind.PRODUCER,
        attributes=messaging_attributes(subject, "send", message_size=len(data)),
    ):
        try:
            ack = await bus.stream_publish(subject, data, headers)
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return None
            raise Unavailable(f"the history stream refused a checkpoint: {exc}") from None
        except (nats.errors.TimeoutError, NoStreamResponseError) as exc:
            raise Unavailable(
                f"the history stream did not confirm a checkpoint of run {ctx.run_id!r} "
                f"({type(exc).__name__})"
            ) from None
    return None if ack.duplicate else ack.seq
