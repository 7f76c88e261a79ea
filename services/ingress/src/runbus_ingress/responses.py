"""`POST /v1/responses`, a documented subset of OpenAI's Responses API: text input (a string or
user messages), `previous_response_id` to continue that response's session, no streaming and no
client-side tools. The response id is `resp_<run_id>`."""

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from aiohttp import web

from runbus import ops
from runbus.client import RunFailedError
from runbus.errors import BadRequest
from runbus.messages import ChatMessage, Content, TextContent
from runbus.messages.runs import RunGet

from .context import (
    RUN_ID_HEADER,
    caller_trace,
    checked_identifier,
    decode_body,
    ingress_of,
    json_response,
)
from .errors import error_response
from .openai_chat import SESSION_HEADER
from .openai_wire import TextPart

RESPONSE_PREFIX = "resp_"


class InputPart(msgspec.Struct, frozen=True, tag="input_text", tag_field="type"):
    text: str


class InputMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputPart | TextPart]


class ResponseRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/responses` (the subset runbus answers)."""

    model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    """The runbus agent to run."""
    input: Annotated[str, msgspec.Meta(min_length=1)] | list[InputMessage]
    previous_response_id: str | None = None
    """Continue that response's session."""
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None


_DECODER = msgspec.json.Decoder(ResponseRequest)


def _texts(body: ResponseRequest) -> list[str]:
    if isinstance(body.input, str):
        return [body.input]
    texts = []
    for message in body.input:
        if message.role != "user":
            continue  # the agent's instructions are its system prompt
        content = message.content
        texts.append(content if isinstance(content, str) else "".join(p.text for p in content))
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise BadRequest("`input` has no user text")
    return texts


async def on_create_response(request: web.Request) -> web.Response:
    ingress = ingress_of(request)
    body = decode_body(await request.read(), _DECODER, "response")
    if body.stream:
        raise BadRequest("`stream` is not supported on /v1/responses; use /v1/chat/completions")
    agent = checked_identifier(body.model, "model")
    contents: list[Content] = [TextContent(text=t) for t in _texts(body)]
    message = ChatMessage(role="user", contents=contents)
    async with ingress.client(request) as client:
        session_id = request.headers.get(SESSION_HEADER) or (body.metadata or {}).get("session_id")
        if body.previous_response_id is not None:
            previous = body.previous_response_id.removeprefix(RESPONSE_PREFIX)
            checked_identifier(previous, "previous_response_id")
            info = await client.call(ops.API_RUNS_GET, RunGet(run_id=previous))
            session_id = info.record.session_id
        session_id = checked_identifier(session_id or f"s-{uuid.uuid4().hex[:16]}", "session id")
        run_id = f"r-{uuid.uuid4().hex[:16]}"
        headers = {RUN_ID_HEADER: run_id, SESSION_HEADER: session_id}
        created = int(time.time())
        with caller_trace(request):
            try:
                done = await client.run(
                    agent,
                    [message],
                    session_id=session_id,
                    run_id=run_id,
                    timeout=ingress.idle_timeout,
                )
            except RunFailedError as exc:
                return error_response(exc.event.error, headers=headers, openai=True)
    usage = {
        "input_tokens": done.usage.input_tokens,
        "output_tokens": done.usage.output_tokens,
        "total_tokens": done.usage.input_tokens + done.usage.output_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    output: dict[str, Any] = {
        "type": "message",
        "id": f"msg_{run_id}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": done.text, "annotations": []}],
    }
    response = {
        "id": f"{RESPONSE_PREFIX}{run_id}",
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": agent,
        "output": [output],
        "usage": usage,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": body.metadata or {},
        "parallel_tool_calls": False,
        "temperature": None,
        "tool_choice": "none",
        "tools": [],
        "top_p": None,
        "runbus": {"run_id": run_id, "session_id": session_id},
    }
    return json_response(response, headers=headers)
