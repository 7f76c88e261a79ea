"""Admit: the caller's input stamped with ids derived from the run id, and the agent's input
guardrails, which may refuse the run before any hop."""

from datetime import UTC, datetime
from typing import Final

import msgspec
import structlog
from opentelemetry import trace

from runbus.errors import BadRequest
from runbus.messages import ChatMessage, RunCompleted, RunRequest, TextContent

from ..errors import InputTooLarge
from ..harness.guardrails import Refusal
from ..harness.runtime import Harness
from .events import RunEvents
from .state import message_id

MAX_INPUT_BYTES: Final = 256 * 1024

log = structlog.get_logger()


def stamp_input(request: RunRequest, now: datetime) -> list[ChatMessage]:
    """Caller messages with ids derived from the run id, so a redelivered run stores them once.

    Only `user` messages are accepted: `system` is the trusted role and a caller-made
    `assistant` or `tool` message would put words in the model's or a tool's mouth.
    """
    size = 0
    for index, message in enumerate(request.input):
        if message.role != "user":
            raise BadRequest(
                f"input[{index}].role is {message.role!r}; a run request carries user messages",
                details={"field": f"input[{index}].role"},
            )
        size += len(message.text.encode())
    if size > MAX_INPUT_BYTES:
        raise InputTooLarge(size, MAX_INPUT_BYTES)
    return [
        msgspec.structs.replace(
            message,
            message_id=message_id(request.run_id, f"in{index}"),
            created_at=message.created_at or now,
            source="external",
        )
        for index, message in enumerate(request.input)
    ]


async def refuse(events: RunEvents, harness: Harness, refusal: Refusal) -> RunCompleted:
    """A guardrail ended the run before any hop: no model call, nothing stored (the refused
    input may be the very secret the guardrail caught)."""
    run_id = events.run_id
    message, _ = harness.rewrite(
        ChatMessage(
            role="assistant",
            contents=[TextContent(text=refusal.text)],
            message_id=message_id(run_id, "m0"),
            created_at=datetime.now(UTC),
        )
    )
    trace.get_current_span().set_attribute("runbus.guardrail", refusal.guardrail)
    log.info("run_refused", run_id=run_id, guardrail=refusal.guardrail)
    await events.text(message.message_id, message.text, event_id="refusal")
    return RunCompleted(run_id=run_id, response=[message], text=message.text)
