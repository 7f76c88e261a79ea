"""Message groups and token estimates, without a bus.

A group is the unit compaction may keep or drop: a tool-call group holds the assistant message
with its function calls and every tool message answering them, so no strategy can split a call
from its result (which providers reject).
"""

from runbus.messages import ChatMessage, MessageGroup
from runbus.messages.compaction import GroupKind
from runbus.messages.contents import Content as ContentPart
from runbus.messages.contents import (
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    TextContent,
    UriContent,
    UsageContent,
)

BYTES_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
"""Per-message framing (role markers) that chat templates add."""


def estimate_content_tokens(part: ContentPart) -> int:
    """Bytes/4 of what the model reads of one part; no tokenizer, no network."""
    match part:
        case TextContent(text=text) | ReasoningContent(text=text):
            size = len(text.encode())
        case FunctionCallContent():
            size = len(part.name) + len(repr(part.arguments).encode())
        case FunctionResultContent():
            size = len(repr(part.result if part.error is None else part.error).encode())
        case UriContent(uri=uri):
            size = len(uri)
        case DataContent(data=data):
            size = len(data)
        case UsageContent():
            size = 0
    return -(-size // BYTES_PER_TOKEN)


def estimate_tokens(message: ChatMessage) -> int:
    return MESSAGE_OVERHEAD_TOKENS + sum(estimate_content_tokens(p) for p in message.contents)


def _kind(message: ChatMessage) -> GroupKind:
    if message.source == "compaction":
        return "summary"
    match message.role:
        case "system":
            return "system"
        case "user":
            return "user"
        case "assistant" if message.function_calls:
            return "tool_call"
        case _:
            return "assistant_text"


def group_messages(messages: list[ChatMessage]) -> list[MessageGroup]:
    """Split a prompt into groups; tool results join the group of the call they answer."""
    groups: list[MessageGroup] = []
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        tokens = estimate_tokens(message)
        answers_open_call = message.role == "tool" and any(
            r.call_id in open_calls for r in message.function_results
        )
        if answers_open_call and groups:
            last = groups[-1]
            groups[-1] = MessageGroup(
                kind=last.kind, start=last.start, count=last.count + 1, tokens=last.tokens + tokens
            )
            open_calls.difference_update(r.call_id for r in message.function_results)
            continue
        kind = _kind(message)
        open_calls = {c.call_id for c in message.function_calls} if kind == "tool_call" else set()
        groups.append(MessageGroup(kind=kind, start=index, count=1, tokens=tokens))
    return groups
