"""Tools for models that cannot call them natively: the tools are described in the system
message, the reply is constrained to a JSON schema (`response_format`, which llama.cpp, vLLM and
Ollama enforce while decoding) that is either an answer or one call, and that JSON is turned
back into ordinary `function_call` contents, so the rest of runbus never knows the difference.

Earlier calls and results in the prompt are written as the text this protocol uses, since the
model's chat template would drop `tool_calls` and `tool` messages.
"""

import json
import uuid
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from runbus.messages import (
    ChatMessage,
    Content,
    FunctionCallContent,
    FunctionResultContent,
    ModelRequest,
    TextContent,
    ToolSpec,
)

INSTRUCTION: Final = (
    "You can use tools. To use one, reply with JSON "
    '{{"tool": "<name>", "arguments": {{...}}}}. To answer the user, reply with JSON '
    '{{"answer": "<your answer>"}}. Tools:\n{tools}'
)


def response_format(tools: list[ToolSpec]) -> dict[str, Any]:
    """A JSON schema that admits an answer or a call of one of `tools` with valid arguments."""
    calls = [
        {
            "type": "object",
            "properties": {"tool": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["tool", "arguments"],
        }
        for tool in tools
    ]
    answer = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
    return {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": {"anyOf": [*calls, answer]}},
    }


def offer(request: ModelRequest) -> ModelRequest:
    """The request with its tools described in the system message and its earlier calls and
    results written as text; no `tools` field."""
    listing = "\n".join(
        f"- {t.name}: {t.description} Arguments (JSON schema): {json.dumps(t.parameters)}"
        for t in request.tools
    )
    instruction = INSTRUCTION.format(tools=listing)
    messages = [_as_text(m) for m in request.messages]
    if messages and messages[0].role == "system":
        system = messages[0]
        text = "".join(p.text for p in system.contents if isinstance(p, TextContent))
        messages[0] = msgspec.structs.replace(
            system, contents=[TextContent(text=f"{text}\n\n{instruction}".strip())]
        )
    else:
        messages.insert(0, ChatMessage(role="system", contents=[TextContent(text=instruction)]))
    return msgspec.structs.replace(request, messages=messages, tools=[])


def _as_text(message: ChatMessage) -> ChatMessage:
    calls, results = message.function_calls, message.function_results
    if not calls and not results:
        return message
    if calls:
        text = "\n".join(
            json.dumps({"tool": c.name, "arguments": c.arguments}, ensure_ascii=False)
            for c in calls
        )
        return msgspec.structs.replace(message, contents=[TextContent(text=text)])
    text = "\n".join(_result_line(r) for r in results)
    return msgspec.structs.replace(message, role="user", contents=[TextContent(text=text)])


def _result_line(result: FunctionResultContent) -> str:
    if result.error is not None:
        return f"Tool error: {result.error}"
    value = result.result if isinstance(result.result, str) else json.dumps(result.result)
    return f"Tool result: {value}"


def read_reply(text: str, tools: list[ToolSpec]) -> list[Content]:
    """The contents the JSON reply stands for: a call of a known tool, or the answer text. A
    reply that is not the JSON asked for (cut by the output cap, say) is kept as text."""
    try:
        reply = json.loads(text)
    except ValueError:
        return [TextContent(text=text)]
    names = {t.name for t in tools}
    if isinstance(reply, dict):
        name, arguments = reply.get("tool"), reply.get("arguments")
        if name in names and isinstance(arguments, dict):
            call_id = f"call_{uuid.uuid4().hex[:12]}"
            return [FunctionCallContent(call_id=call_id, name=name, arguments=arguments)]
        if isinstance(answer := reply.get("answer"), str):
            return [TextContent(text=answer)]
    return [TextContent(text=text)]


def stamped(contents: list[Content]) -> ChatMessage:
    return ChatMessage(role="assistant", contents=contents, created_at=datetime.now(UTC))
