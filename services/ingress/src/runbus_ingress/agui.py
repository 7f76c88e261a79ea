"""A run as an AG-UI event stream: `POST /v1/agui/{agent}` takes AG-UI's `RunAgentInput` and
runs the agent; `GET /v1/runs/{run_id}/agui` follows a run already started.

The AG-UI thread is the runbus session (`thread_id` = `session_id`): the conversation lives in
runbus's history, so a run's input is the input's last user turn. The todo list of the session
arrives as `STATE_SNAPSHOT` (`{"todos": [...]}`) at the start, after each todo tool and at the
end; an approval the run waits for is a `CUSTOM` event named `runbus.approval_requested`, and
its owner's pause and resume are `CUSTOM` events named `runbus.paused` (with the pending calls)
and `runbus.resumed` (AG-UI has no pause of its own).
"""

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Final, assert_never

import msgspec
import structlog
from ag_ui import core as ag
from aiohttp import web

from runbus import ops, todos
from runbus.client import RunbusClient, SequencedEvent
from runbus.decoding import decode_untrusted
from runbus.errors import BadRequest, NotFound, RemoteError
from runbus.messages import (
    ChatMessage,
    Content,
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
from runbus.messages.runs import RunGet
from runbus.messages.sessions import SessionGet

from . import sse
from .client_tools import after_answers, answer, offered, public_call_id
from .context import (
    RUN_ID_HEADER,
    checked_identifier,
    identifier,
    ingress_of,
)
from .errors import error_response

log = structlog.get_logger()

APPROVAL_EVENT: Final = "runbus.approval_requested"
PAUSED_EVENT: Final = "runbus.paused"
RESUMED_EVENT: Final = "runbus.resumed"
PROGRESS_EVENT: Final = "runbus.tool_progress"
TODO_TOOL_PREFIX: Final = "todos_"


class Translator:
    """runbus run events → AG-UI events, one run at a time (it remembers the open message)."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.open_message: str | None = None
        self.tool_names: dict[str, str] = {}
        self.client_calls = 0
        self.client_expected = 0

    @property
    def paused(self) -> bool:
        """The run handed every call of its step that is the client's: it waits for answers,
        and this AG-UI run is finished (the client answers in its next one)."""
        return 0 < self.client_expected <= self.client_calls

    def translate(self, event: RunEvent) -> list[ag.BaseEvent]:
        out: list[ag.BaseEvent] = []
        if self.open_message is not None and not (
            isinstance(event, RunTextDelta) and event.message_id == self.open_message
        ):
            out.append(ag.TextMessageEndEvent(message_id=self.open_message))
            self.open_message = None
        match event:
            case RunStarted(session_id=session_id):
                self.thread_id = session_id
                out.append(ag.RunStartedEvent(thread_id=session_id, run_id=self.run_id))
            case RunTextDelta(message_id=message_id, delta=delta):
                if self.open_message is None:
                    out.append(ag.TextMessageStartEvent(message_id=message_id, role="assistant"))
                    self.open_message = message_id
                out.append(ag.TextMessageContentEvent(message_id=message_id, delta=delta))
            case RunToolCall(call=call, client=client, client_calls=expected):
                self.tool_names[call.call_id] = call.name
                # A frontend tool's call is answered by the id: it names the runbus run.
                call_id = public_call_id(event.run_id, call.call_id) if client else call.call_id
                out += [
                    ag.ToolCallStartEvent(tool_call_id=call_id, tool_call_name=call.name),
                    ag.ToolCallArgsEvent(
                        tool_call_id=call_id, delta=json.dumps(call.arguments or {})
                    ),
                    ag.ToolCallEndEvent(tool_call_id=call_id),
                ]
                if client:
                    self.client_calls += 1
                    self.client_expected = expected
                    if self.paused:
                        out.append(
                            ag.RunFinishedEvent(
                                thread_id=self.thread_id,
                                run_id=self.run_id,
                                result={"waiting_for": "tool_calls"},
                            )
                        )
            case RunToolResult(result=result):
                content = (
                    json.dumps({"error": result.error})
                    if result.error
                    else json.dumps(result.result, default=str)
                )
                out.append(
                    ag.ToolCallResultEvent(
                        message_id=f"{self.run_id}:{result.call_id}:result",
                        tool_call_id=result.call_id,
                        content=content,
                        role="tool",
                    )
                )
            case RunApprovalRequested():
                value = msgspec.to_builtins(event)
                out.append(ag.CustomEvent(name=APPROVAL_EVENT, value=value))
            case RunCompleted(text=text, usage=usage):
                finished = {"text": text, "usage": msgspec.to_builtins(usage)}
                out.append(
                    ag.RunFinishedEvent(
                        thread_id=self.thread_id, run_id=self.run_id, result=finished
                    )
                )
            case RunFailed(error=error):
                out.append(ag.RunErrorEvent(message=error.message, code=error.code))
            case RunPaused() | RunResumed():
                name = PAUSED_EVENT if isinstance(event, RunPaused) else RESUMED_EVENT
                out.append(ag.CustomEvent(name=name, value=msgspec.to_builtins(event)))
            case RunToolProgress():
                # AG-UI has no progress event for a tool call: a custom one, as for approvals.
                out.append(ag.CustomEvent(name=PROGRESS_EVENT, value=msgspec.to_builtins(event)))
            case RunCompacted():
                pass  # the run's own housekeeping: AG-UI has no event for it
            case _:
                assert_never(event)
        return out

    def todos_may_have_changed(self, event: RunEvent) -> bool:
        match event:
            case RunStarted() | RunCompleted():
                return True
            case RunToolResult(result=result):
                return self.tool_names.get(result.call_id, "").startswith(TODO_TOOL_PREFIX)
            case (
                RunApprovalRequested()
                | RunCompacted()
                | RunPaused()
                | RunResumed()
                | RunTextDelta()
                | RunToolCall()
                | RunToolProgress()
            ):
                return False
            case RunFailed():
                return False
            case _:
                assert_never(event)


def run_input(body: ag.RunAgentInput) -> list[ChatMessage]:
    """The user messages after the last assistant message, as the run's input."""
    messages = body.messages
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    texts = [
        m.content if isinstance(m.content, str) else _text_of(m.content)
        for m in messages[last + 1 :]
        if m.role == "user"
    ]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise BadRequest("`messages` must end with a user message that has text")
    contents: list[Content] = [TextContent(text=t) for t in texts]
    return [ChatMessage(role="user", contents=contents)]


def _tool_text(message: ag.ToolMessage) -> str:
    if message.error is not None:
        return f"error: {message.error}"
    content = message.content
    return content if isinstance(content, str) else _text_of(content)


def _text_of(parts: list[Any]) -> str:
    return "".join(getattr(part, "text", "") or "" for part in parts)


async def on_run_agent(request: web.Request) -> web.StreamResponse:
    ingress = ingress_of(request)
    agent = identifier(request, "agent")
    body = decode_untrusted(
        ag.RunAgentInput.model_validate_json, await request.read(), "AG-UI RunAgentInput"
    )
    thread_id = checked_identifier(body.thread_id, "thread_id")
    run_id = checked_identifier(body.run_id, "run_id")
    async with ingress.client(request) as client:
        resumed = await answer(client, answers_of(body))
        if resumed is not None:
            # Frontend tools answered: the runbus run that waits on them goes on.
            followed, answered = resumed
            translator = Translator(thread_id, run_id)
            started = RunStarted(run_id=followed, session_id=thread_id, agent=agent)
            return await _agui_stream(
                request,
                client,
                translator,
                after=0,
                follow=followed,
                answered=answered,
                started=started,
            )
        specs = [
            ToolSpec(
                name=t.name,
                description=t.description,
                parameters=t.parameters or {"type": "object", "properties": {}},
            )
            for t in body.tools or []
        ]
        client_tools = await offered(client, agent, "tools", specs)
        messages = run_input(body)
        await client.start(
            agent, messages, session_id=thread_id, run_id=run_id, client_tools=client_tools
        )
        return await _agui_stream(request, client, Translator(thread_id, run_id), after=0)


def answers_of(body: ag.RunAgentInput) -> list[tuple[str, str]]:
    """The trailing tool messages that answer frontend tool calls (`(tool_call_id, text)`)."""
    messages = body.messages
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return [
        (m.tool_call_id, _tool_text(m))
        for m in messages[last + 1 :]
        if isinstance(m, ag.ToolMessage)
    ]


async def on_watch_run(request: web.Request) -> web.StreamResponse:
    ingress = ingress_of(request)
    run_id = identifier(request, "run_id")
    async with ingress.client(request) as client:
        info = await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        translator = Translator(info.record.session_id, run_id)
        return await _agui_stream(request, client, translator, after=0)


async def _agui_stream(
    request: web.Request,
    client: RunbusClient,
    translator: Translator,
    *,
    after: int,
    follow: str | None = None,
    answered: set[str] | None = None,
    started: RunStarted | None = None,
) -> web.StreamResponse:
    """`follow`: the runbus run, when it is not the AG-UI run (a resumed one: its events after
    the `answered` calls' results, opened with `started`)."""
    ingress = ingress_of(request)
    headers = {RUN_ID_HEADER: follow or translator.run_id}
    followed = client.follow(follow or translator.run_id, after=after, timeout=ingress.idle_timeout)
    events = _resumed(started, after_answers(followed, answered or set()))
    async with (
        aclosing(events),
        aclosing(sse.with_keepalives(events, ingress.keepalive)) as paced,
    ):
        first = await anext(paced)
        if first is not None and isinstance(first.event, RunFailed):
            return error_response(first.event.error, headers=headers)
        response = await sse.open_stream(request, headers)
        try:
            await _send(response, client, translator, first, paced)
        except ConnectionResetError:
            log.info("agui_stream_closed", run_id=translator.run_id)
        except asyncio.CancelledError:
            log.info("agui_stream_closed", run_id=translator.run_id)
            raise
        except Exception:
            # The status line is long gone: end the stream; the client can watch the run again.
            log.exception("agui_stream_failed", run_id=translator.run_id)
        return response


async def _send(
    response: web.StreamResponse,
    client: RunbusClient,
    translator: Translator,
    first: SequencedEvent | None,
    paced: AsyncIterator[SequencedEvent | None],
) -> None:
    snapshot: Any = None
    async for item in _chain(first, paced):
        if item is None:
            await response.write(sse.KEEPALIVE)
            continue
        out = translator.translate(item.event)
        if translator.todos_may_have_changed(item.event):
            current = await _todos(client, translator.thread_id)
            if current != snapshot:
                snapshot = current
                state = ag.StateSnapshotEvent(snapshot={"todos": current})
                # The list as it stands at the end belongs before the run's end.
                at = len(out) - 1 if isinstance(item.event, RunCompleted) else len(out)
                out.insert(at, state)
        for event in out:
            await response.write(sse.data_frame(event.model_dump_json(by_alias=True).encode()))
        if translator.paused:
            return


async def _resumed(
    started: RunStarted | None, events: AsyncGenerator[SequencedEvent, None]
) -> AsyncGenerator[SequencedEvent, None]:
    """`events`, opened with `started` (an AG-UI run always starts with `RUN_STARTED`)."""
    try:
        if started is not None:
            yield SequencedEvent(seq=0, event=started)
        async for item in events:
            yield item
    finally:
        await events.aclose()


async def _chain(
    first: SequencedEvent | None, rest: AsyncIterator[SequencedEvent | None]
) -> AsyncIterator[SequencedEvent | None]:
    yield first
    async for item in rest:
        yield item


async def _todos(client: RunbusClient, session_id: str) -> list[dict[str, Any]]:
    try:
        info = await client.call(ops.SESSIONS_GET, SessionGet(session_id=session_id))
    except RemoteError as exc:
        if exc.known_code != NotFound.code:
            raise
        return []  # the run has not opened its session yet: it has no list
    try:
        state = todos.load(info.record.state.get(todos.STATE_KEY))
    except msgspec.ValidationError:
        return []  # not a todo list: nothing this stream can show
    items: list[dict[str, Any]] = msgspec.to_builtins(state.items)
    return items
