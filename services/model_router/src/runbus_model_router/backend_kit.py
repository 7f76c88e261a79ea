"""Helpers for model backends, the router's own and plugins' (`RUNBUS_MODEL_BACKENDS`): the turn so
far, ids, word-sized deltas, usage."""

import re
from datetime import UTC, datetime

from runbus.messages import ChatMessage, FunctionResultContent, Usage

from .backends import OnDelta

_WORD = re.compile(r"\s*\S+\s*|\s+")


def since_last_user(messages: list[ChatMessage]) -> tuple[ChatMessage | None, list[ChatMessage]]:
    """The last user message and what came after it (this turn's model and tool messages).

    A user message a context provider injected (the todo list) is context, not a new turn.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "user" and message.source != "context_provider":
            return message, [m for m in messages[index + 1 :] if m.source != "context_provider"]
    return None, list(messages)


def results_after(messages: list[ChatMessage]) -> list[FunctionResultContent]:
    return [r for m in messages for r in m.function_results]


async def stream_words(text: str, on_delta: OnDelta) -> None:
    for match in _WORD.finditer(text):
        await on_delta(match.group())


def estimate_usage(prompt: list[ChatMessage], reply: ChatMessage) -> Usage:
    """Bytes/4, as the offline models have no tokenizer."""
    read = sum(len(m.text) + 16 for m in prompt) // 4
    return Usage(input_tokens=read, output_tokens=max(1, len(reply.text) // 4))


def assistant(contents: list[object], *, step: int) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        contents=contents,  # type: ignore[arg-type]
        created_at=datetime.now(UTC),
        message_id=f"step-{step}",
    )
