"""The scripted backend for tests: each script is a fixed sequence of replies.

Reply number N of a turn is the one after N assistant messages since the last user message, so
the backend keeps no state and any replica answers the same. `{last_result}` in a reply's text
is replaced by the JSON of the turn's latest tool result.
"""

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from runbus.messages import FunctionCallContent, ModelRequest, ModelResponse, TextContent
from runbus_model_router.backend_kit import (
    assistant,
    estimate_usage,
    results_after,
    since_last_user,
    stream_words,
)
from runbus_model_router.backends import OnDelta
from runbus_model_router.errors import ScriptExhausted


class ScriptedCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    arguments: dict[str, Any] = {}


class ScriptedReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    text: str = ""
    tool_calls: list[ScriptedCall] = []


Scripts = dict[str, list[ScriptedReply]]


def load_scripts(path: Path) -> Scripts:
    """`[[<script>]]` tables of a TOML file, each with `text` and/or `tool_calls`."""
    return msgspec.convert(tomllib.loads(path.read_text()), Scripts)


class ScriptedModel:
    name = "scripted"

    def __init__(self, script: str, replies: list[ScriptedReply]) -> None:
        self.script = script
        self.replies = replies

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        _, turn = since_last_user(request.messages)
        index = sum(1 for m in turn if m.role == "assistant")
        if index >= len(self.replies):
            raise ScriptExhausted(self.script, index)
        reply = self.replies[index]
        contents: list[object] = []
        if reply.text:
            text = reply.text
            if "{last_result}" in text:
                results = results_after(turn)
                last = msgspec.json.encode(results[-1].result).decode() if results else ""
                text = text.replace("{last_result}", last)
            await stream_words(text, on_delta)
            contents.append(TextContent(text=text))
        contents.extend(
            FunctionCallContent(call_id=f"call-{index}-{i}", name=c.name, arguments=c.arguments)
            for i, c in enumerate(reply.tool_calls)
        )
        message = assistant(contents, step=index)
        return ModelResponse(
            message=message,
            model=f"scripted/{self.script}",
            finish_reason="tool_calls" if reply.tool_calls else "stop",
            usage=estimate_usage(request.messages, message),
        )
