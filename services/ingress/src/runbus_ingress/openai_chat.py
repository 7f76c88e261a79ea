"""`POST /v1/chat/completions`, `GET /v1/models` and `GET /v1/models/{model}`: a runbus agent
behind OpenAI's API.

`model` names the agent. runbus keeps the conversation server-side in a session: the run's input
is the request's last user turn, and the session comes from the `Runbus-Session-Id` header, else
`metadata.session_id`, else `user` (the caller's own session of that name: docs/security.md).
Without any, each request is a new session and the earlier turns in `messages` travel as quoted
context in the first user message. The agent's own tools run server-side; the `runbus`
extension field reports them.
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Final, assert_never

import msgspec
import structlog
from aiohttp import web

from runbus import ops, session_ids
from runbus.client import RunbusClient, SequencedEvent
from runbus.errors import BadRequest, RunbusError, Unavailable, UnknownAgent
from runbus.messages import (
    ChatMessage,
    Content,
    ErrorInfo,
    FunctionCallContent,
    OutputFormat,
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolProgress,
    RunToolResult,
    TextContent,
    ToolSpec,
)
from runbus.messages.runs import AgentList, RunGet

from . import openai_wire as oa
from . import sse
from .client_tools import after_answers, answer, arguments_text, offered, public_call_id
from .context import (
    RUN_ID_HEADER,
    checked_identifier,
    decode_body,
    ingress_of,
    json_response,
)
from .errors import error_response, openai_error, status_of

log = structlog.get_logger()

SESSION_HEADER: Final = "Runbus-Session-Id"
DONE: Final = b"data: [DONE]\n\n"


async def session_of(
    request: web.Request, body: oa.ChatCompletionRequest, client: RunbusClient
) -> str | None:
    """The session a request names: header, then `metadata.session_id` (ids the client chose,
    as the bus API takes them), then `user`, scoped to the caller: any client may put any
    `user`, so it names the caller's own session of that name, never another user's."""
    named = request.headers.get(SESSION_HEADER) or (body.metadata or {}).get("session_id")
    if named:
        return checked_identifier(named, "session id")
    if body.user:
        me = await client.identity()
        return session_ids.scoped(me.tenant, me.user_id, body.user)
    return None


def run_input(messages: list[oa.ChatInMessage], *, resumed: bool) -> list[ChatMessage]:
    """The run's input: the user messages after the last assistant message. A new session gets
    the turns before them as quoted context (the agent's instructions stay its system prompt,
    so `system`/`developer` messages become part of that context, never a system message)."""
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    turn = [m for m in messages[last_assistant + 1 :] if m.role == "user" and m.text.strip()]
    if not turn:
        raise BadRequest("`messages` must end with a user message that has text")
    texts: list[Content] = [TextContent(text=m.text) for m in turn]
    earlier = [m for m in messages[: last_assistant + 1] if m.text.strip()]
    earlier += [m for m in messages[last_assistant + 1 :] if m.role in ("system", "developer")]
    if earlier and not resumed:
        quoted = "\n".join(f"{m.role}: {m.text}" for m in earlier)
        texts.insert(0, TextContent(text=f"Earlier in this conversation:\n{quoted}\n---"))
    return [ChatMessage(role="user", contents=texts)]


class Completion:
    """The facts of one run that a completion reports, gathered from its events."""

    def __init__(self, agent: str, run_id: str, session_id: str, trace_id: str) -> None:
        self.id = f"chatcmpl-{run_id}"
        self.created = int(time.time())
        self.agent = agent
        self.extension = oa.RunbusExtension(run_id=run_id, session_id=session_id, trace_id=trace_id)
        self.tools: dict[str, oa.ToolActivity] = {}
        self.client_calls: list[FunctionCallContent] = []
        """Calls of the client's own tools the run handed over, in order."""
        self.client_expected = 0

    @property
    def paused(self) -> bool:
        """The run handed every call of its step that is the client's: it waits for answers."""
        return 0 < self.client_expected <= len(self.client_calls)

    def tool_calls(self) -> list[oa.ToolCall]:
        run_id = self.extension.run_id
        return [
            oa.ToolCall(
                id=public_call_id(run_id, c.call_id),
                function=oa.CalledFunction(name=c.name, arguments=arguments_text(c.arguments)),
            )
            for c in self.client_calls
        ]

    def on_event(self, event: RunEvent) -> oa.ToolActivity | None:
        """Record tool activity; the changed call, if the event was one."""
        match event:
            case RunToolCall(call=call, client=True, client_calls=expected):
                self.client_calls.append(call)
                self.client_expected = expected
                return None
            case RunToolCall(call=call):
                activity = oa.ToolActivity(
                    call_id=call.call_id, name=call.name, arguments=call.arguments or {}
                )
            case RunApprovalRequested(call_id=call_id):
                known = self.tools.get(call_id)
                if known is None:
                    return None
                activity = msgspec.structs.replace(known, status="waiting_approval")
            case RunToolResult(result=result):
                known = self.tools.get(result.call_id)
                activity = oa.ToolActivity(
                    call_id=result.call_id,
                    name=known.name if known else "",
                    arguments=known.arguments if known else {},
                    result=result.result,
                    error=result.error,
                    status="done",
                )
            case (
                RunStarted()
                | RunCompacted()
                | RunPaused()
                | RunResumed()
                | RunTextDelta()
                | RunCompleted()
                | RunFailed()
                | RunToolProgress()
            ):
                return None
            case _:
                assert_never(event)
        self.tools[activity.call_id] = activity
        return activity

    def frames(self, event: RunEvent, include_usage: bool) -> tuple[list[bytes], bool]:
        """The stream frames `event` becomes, and whether the stream ends with them."""
        frames = []
        if (tool := self.on_event(event)) is not None:
            frames.append(self.chunk(oa.Delta(), tool=tool))
        if isinstance(event, RunToolCall) and event.client:
            index = len(self.client_calls) - 1
            called = self.tool_calls()[index]
            handed = oa.ToolCallDelta(index=index, id=called.id, function=called.function)
            frames.append(self.chunk(oa.Delta(tool_calls=[handed])))
            if self.paused:
                frames.append(self.chunk(oa.Delta(), finish="tool_calls"))
                return frames, True
            return frames, False
        match event:
            case RunTextDelta(delta=delta):
                frames.append(self.chunk(oa.Delta(content=delta)))
            case RunCompleted():
                frames.append(self.chunk(oa.Delta(), finish="stop"))
                if include_usage:
                    frames.append(self.chunk(usage=self.usage(event)))
                return frames, True
            case RunFailed(error=error):
                body = {"error": openai_error(error, status_of(error.code))}
                frames.append(sse.data_frame(msgspec.json.encode(body)))
                return frames, True
            case RunToolCall() | RunApprovalRequested() | RunToolResult():
                pass  # the tool chunk above
            case RunStarted() | RunCompacted() | RunPaused() | RunResumed() | RunToolProgress():
                pass  # no chunk: OpenAI's stream has nothing for them
            case _:
                assert_never(event)
        return frames, False

    def usage(self, done: RunCompleted) -> oa.Usage:
        used = done.usage
        total = used.input_tokens + used.output_tokens
        return oa.Usage(used.input_tokens, used.output_tokens, total)

    def final(self, done: RunCompleted) -> oa.ChatCompletion:
        extension = msgspec.structs.replace(self.extension, tool_calls=list(self.tools.values()))
        return oa.ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.agent,
            choices=[oa.Choice(message=oa.AssistantMessage(content=done.text))],
            usage=self.usage(done),
            runbus=extension,
        )

    def handed_over(self) -> oa.ChatCompletion:
        """The completion of a run that waits for the client's tools: their calls, no text.
        Its usage is counted in the completion that ends the run."""
        extension = msgspec.structs.replace(self.extension, tool_calls=list(self.tools.values()))
        message = oa.AssistantMessage(content=None, tool_calls=self.tool_calls())
        return oa.ChatCompletion(
            id=self.id,
            created=self.created,
            model=self.agent,
            choices=[oa.Choice(message=message, finish_reason="tool_calls")],
            usage=oa.Usage(0, 0, 0),
            runbus=extension,
        )

    def chunk(
        self,
        delta: oa.Delta | None = None,
        *,
        finish: oa.FinishReason | None = None,
        usage: oa.Usage | None = None,
        tool: oa.ToolActivity | None = None,
    ) -> bytes:
        choices = [] if delta is None else [oa.ChunkChoice(delta, finish_reason=finish)]
        extension = msgspec.structs.replace(self.extension, tool_calls=[tool]) if tool else None
        chunk = oa.ChatCompletionChunk(
            id=self.id,
            created=self.created,
            model=self.agent,
            choices=choices,
            usage=usage,
            runbus=extension,
        )
        return sse.data_frame(msgspec.json.encode(chunk))


def output_format(asked: oa.ResponseFormat | None) -> OutputFormat | None:
    """The run's output format from `response_format` (the gateway refuses a schema that is no
    JSON Schema: a 400 like any refused request)."""
    match asked:
        case None | oa.TextFormat():
            return None
        case oa.JsonObjectFormat():
            return OutputFormat(name="output")
        case oa.JsonSchemaResponseFormat(json_schema=wanted):
            return OutputFormat(
                name=wanted.name, schema=wanted.schema, strict=wanted.strict is not False
            )
        case _:
            assert_never(asked)


async def on_chat_completions(request: web.Request) -> web.StreamResponse:
    ingress = ingress_of(request)
    body = decode_body(await request.read(), oa.CHAT_COMPLETION_REQUEST_DECODER, "chat completion")
    checked_identifier(body.model, "model")
    async with ingress.client(request) as client:
        named = await session_of(request, body, client)
        resumed = await answer(client, answers_of(body.messages))
        if resumed is not None:
            # The client answered calls of its tools: the same run goes on; follow it.
            run_id, answered = resumed
            info = await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
            session_id = info.record.session_id
            completion = Completion(body.model, run_id, session_id, info.record.trace_id)
        else:
            session_id = named or f"s-{uuid.uuid4().hex[:16]}"
            messages = run_input(body.messages, resumed=named is not None)
            specs = [
                ToolSpec(
                    name=t.function.name,
                    description=t.function.description,
                    parameters=t.function.parameters or {"type": "object", "properties": {}},
                )
                for t in body.tools or []
            ]
            run_id, trace_id = await client.start_traced(
                body.model,
                messages,
                session_id=session_id,
                output_format=output_format(body.response_format),
                client_tools=await offered(client, body.model, "tools", specs),
            )
            completion = Completion(body.model, run_id, session_id, trace_id)
            answered = set()
        headers = {RUN_ID_HEADER: run_id, SESSION_HEADER: session_id}
        followed = client.follow(run_id, timeout=ingress.idle_timeout)
        async with aclosing(after_answers(followed, answered)) as events:
            if not body.stream:
                return await _whole(completion, events, headers)
            async with aclosing(sse.with_keepalives(events, ingress.keepalive)) as paced:
                first = await anext(paced)
                if first is not None and isinstance(first.event, RunFailed):
                    return error_response(first.event.error, headers=headers, openai=True)
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                return await _stream(request, completion, first, paced, headers, include_usage)


def answers_of(messages: list[oa.ChatInMessage]) -> list[tuple[str, str]]:
    """The trailing `tool` messages that answer calls (`(tool_call_id, text)`)."""
    last_assistant = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return [
        (m.tool_call_id, m.text)
        for m in messages[last_assistant + 1 :]
        if m.role == "tool" and m.tool_call_id
    ]


async def on_list_models(request: web.Request) -> web.Response:
    async with ingress_of(request).client(request) as client:
        listed = await client.call(ops.API_AGENTS_LIST, AgentList())
    models = [oa.Model(id=a.name, description=a.description) for a in listed.agents]
    return json_response(oa.ModelList(data=models))


async def on_get_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{model}`: one of the caller's agents, as `client.models.retrieve` reads."""
    name = request.match_info["model"]
    async with ingress_of(request).client(request) as client:
        listed = await client.call(ops.API_AGENTS_LIST, AgentList())
    for agent in listed.agents:
        if agent.name == name:
            return json_response(oa.Model(id=agent.name, description=agent.description))
    raise UnknownAgent(f"no agent {name!r}")


async def _whole(
    completion: Completion, events: AsyncIterator[SequencedEvent], headers: dict[str, str]
) -> web.Response:
    async for item in events:
        event = item.event
        completion.on_event(event)
        if completion.paused:
            return json_response(completion.handed_over(), headers=headers)
        match event:
            case RunCompleted():
                return json_response(completion.final(event), headers=headers)
            case RunFailed(error=error):
                return error_response(error, headers=headers, openai=True)
            case (
                RunStarted()
                | RunApprovalRequested()
                | RunCompacted()
                | RunPaused()
                | RunResumed()
                | RunTextDelta()
                | RunToolProgress()
            ):
                pass  # the answer is the final event's text
            case RunToolCall() | RunToolResult():
                pass  # kept by `on_event` for the answer's tool activity
            case _:
                assert_never(event)
    raise Unavailable("the event stream ended without a final event")


async def _stream(
    request: web.Request,
    completion: Completion,
    first: SequencedEvent | None,
    paced: AsyncIterator[SequencedEvent | None],
    headers: dict[str, str],
    include_usage: bool,
) -> web.StreamResponse:
    response = await sse.open_stream(request, headers)
    try:
        await _send_chunks(response, completion, first, paced, include_usage)
    except ConnectionResetError:
        log.info("openai_stream_closed", run_id=completion.extension.run_id)
        return response
    except asyncio.CancelledError:
        log.info("openai_stream_closed", run_id=completion.extension.run_id)
        raise
    except Exception as exc:
        # The status line is long gone: OpenAI's way is an `error` object in the stream.
        log.exception("openai_stream_failed", run_id=completion.extension.run_id)
        info = (
            exc.to_info()
            if isinstance(exc, RunbusError)
            else ErrorInfo(code="internal", message="internal error")
        )
        error = {"error": openai_error(info, status_of(info.code))}
        await response.write(sse.data_frame(msgspec.json.encode(error)))
    await response.write(DONE)
    return response


async def _send_chunks(
    response: web.StreamResponse,
    completion: Completion,
    first: SequencedEvent | None,
    paced: AsyncIterator[SequencedEvent | None],
    include_usage: bool,
) -> None:
    await response.write(completion.chunk(oa.Delta(role="assistant", content="")))
    item = first
    while True:
        if item is None:
            await response.write(sse.KEEPALIVE)
        else:
            frames, done = completion.frames(item.event, include_usage)
            for frame in frames:
                await response.write(frame)
            if done:
                break
        try:
            item = await anext(paced)
        except StopAsyncIteration:
            break
