"""Structured output for a target without `response_format` (`native_output = false`): the
output format is offered as one more tool, `final_result`, whose arguments are the answer; the
model's call of it comes back as the answer's JSON text, so the caller never knows."""

import json
from typing import Any, Final

import msgspec

from runbus.messages import ModelRequest, ModelResponse, TextContent, ToolSpec

OUTPUT_TOOL: Final = "final_result"
WRAPPED: Final = "result"
"""The one argument a schema that is no object schema is wrapped in (tool arguments are an
object)."""


def _wraps(schema: dict[str, Any] | None) -> bool:
    return schema is not None and schema.get("type") != "object"


def offer(request: ModelRequest) -> ModelRequest:
    """`request` with its output format offered as the `final_result` tool instead."""
    output = request.response_format
    assert output is not None
    schema = output.schema
    if schema is None:
        parameters: dict[str, Any] = {"type": "object"}
    elif _wraps(schema):
        parameters = {"type": "object", "properties": {WRAPPED: schema}, "required": [WRAPPED]}
    else:
        parameters = schema
    tool = ToolSpec(
        name=OUTPUT_TOOL,
        description=(
            f"Give your final answer ({output.name}) by calling this tool with it as the "
            "arguments. Call it once, with nothing else, when you are done."
        ),
        parameters=parameters,
    )
    return msgspec.structs.replace(request, tools=[*request.tools, tool], response_format=None)


def answer(request: ModelRequest, response: ModelResponse) -> ModelResponse:
    """`response` with a call of `final_result` turned into the answer's JSON text (any other
    call in the same reply is dropped: the model said it is done)."""
    message = response.message
    final = next((c for c in message.function_calls if c.name == OUTPUT_TOOL), None)
    if final is None:
        return response
    schema = request.response_format.schema if request.response_format else None
    value: Any = final.arguments.get(WRAPPED) if _wraps(schema) else final.arguments
    text = TextContent(text=json.dumps(value, ensure_ascii=False))
    return msgspec.structs.replace(
        response,
        message=msgspec.structs.replace(message, contents=[text]),
        finish_reason="stop",
    )
