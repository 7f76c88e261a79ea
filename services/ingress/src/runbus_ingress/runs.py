"""runbus's own run API: start, read, list, cancel and approve runs, and their events as SSE;
pause, edit, resume and fork them.

Each handler makes the bus calls any client makes, on the caller's own connection: the gateway
authenticates and authorizes, this process only translates.
"""

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Annotated, Final, Literal, assert_never

import msgspec
import structlog
from aiohttp import hdrs, web

from runbus import ops
from runbus.client import SequencedEvent, new_run_id
from runbus.decoding import sequence
from runbus.errors import Unavailable
from runbus.messages import (
    Identifier,
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolProgress,
    RunToolResult,
    encode,
)
from runbus.messages.runs import (
    ApprovalDecide,
    CallEdit,
    RunCancel,
    RunEdit,
    RunFork,
    RunGet,
    RunList,
    RunPause,
    RunPendingGet,
    RunResume,
    RunStatus,
)

from . import sse
from .bodies import decode_start_run
from .context import (
    RUN_ID_HEADER,
    TRACE_ID_HEADER,
    decode_body,
    identifier,
    identifier_query,
    ingress_of,
    int_query,
    json_response,
)
from .errors import error_response

log = structlog.get_logger()

ENDED: Final[frozenset[RunStatus]] = frozenset({"completed", "failed", "cancelled"})
REPLAY_TIMEOUT: Final = 2.0
"""Seconds to wait for the stored events of a run that has ended: they are all in the stream,
so none arriving means the client has seen them all."""

Events = AsyncGenerator[SequencedEvent, None]
Paced = AsyncGenerator[SequencedEvent | None, None]


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/runs/{run_id}/approvals/{call_id}`."""

    decision: Literal["approved", "denied"]
    """The person's decision."""
    note: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    """Shown to the model with a denial."""


class Detached(msgspec.Struct, frozen=True):
    """Answer of `POST /v1/runs?detach=true`: the run is on its way; follow its events."""

    run_id: str
    session_id: str
    trace_id: str


class Edit(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/runs/{run_id}/edit`: changes to a paused run's pending step."""

    replace: list[CallEdit] = []
    """Calls whose arguments change (checked against the tool's schema)."""
    drop: list[str] = []
    """Ids of calls not to run."""
    add: list[Annotated[str, msgspec.Meta(max_length=16384)]] = []
    """User messages the model reads next."""


class Fork(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/runs/{run_id}/fork`: a new session from one of the run's checkpoints."""

    session_id: Identifier
    """The new session; it must not exist yet."""
    checkpoint: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """How many of the run's stored messages it keeps (None: all)."""


_DECISION = msgspec.json.Decoder(Decision)
_EDIT = msgspec.json.Decoder(Edit)
_FORK = msgspec.json.Decoder(Fork)


async def on_start_run(request: web.Request) -> web.StreamResponse:
    ingress = ingress_of(request)
    start = decode_start_run(await request.read())
    run_id = start.run_id or new_run_id()
    session_id = start.session()
    async with ingress.client(request) as client:
        _, trace_id = await client.start_traced(
            start.agent, start.message(), session_id=session_id, run_id=run_id
        )
        log.info("http_run_started", run_id=run_id, agent=start.agent)
        headers = {RUN_ID_HEADER: run_id, TRACE_ID_HEADER: trace_id}
        if _flag(request, "detach"):
            return json_response(
                Detached(run_id, session_id, trace_id), status=202, headers=headers
            )
        # The events are read from the stream from its first one, so nothing published before
        # this subscription exists is missed.
        async with aclosing(client.follow(run_id, timeout=ingress.idle_timeout)) as events:
            if _flag(request, "wait") or _wants_json(request):
                return await _final(events, headers)
            async with aclosing(sse.with_keepalives(events, ingress.keepalive)) as paced:
                # The status waits for the first event, or a keepalive's time when the run is
                # queued: a run refused at once (bad token, unknown agent, bad input) is an
                # HTTP error like any other request's, not a stream.
                first = await anext(paced)
                if first is not None and isinstance(first.event, RunFailed):
                    return error_response(first.event.error, headers=headers)
                return await stream(request, run_id, first, paced, headers)


async def on_list_runs(request: web.Request) -> web.Response:
    session_id = identifier_query(request, "session_id")
    parent_run_id = identifier_query(request, "parent_run_id")
    limit = int_query(request, "limit", 50, low=1, high=1000)
    asked = RunList(session_id=session_id, limit=limit, parent_run_id=parent_run_id)
    async with ingress_of(request).client(request) as client:
        listed = await client.call(ops.API_RUNS_LIST, asked)
    return json_response(encode(listed))


async def on_get_run(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    async with ingress_of(request).client(request) as client:
        info = await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
    headers = {TRACE_ID_HEADER: info.record.trace_id} if info.record.trace_id else None
    return json_response(encode(info.record), headers=headers)


async def on_cancel_run(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    async with ingress_of(request).client(request) as client:
        info = await client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
    # 202: the cancel is on its way to the run; the record shows the status before it.
    return json_response(encode(info.record), status=200 if info.record.status in ENDED else 202)


async def on_decide(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    call_id = request.match_info["call_id"]
    decision = decode_body(await request.read(), _DECISION, "decision")
    decide = ApprovalDecide(
        run_id=run_id, call_id=call_id, decision=decision.decision, note=decision.note
    )
    async with ingress_of(request).client(request) as client:
        decided = await client.call(ops.API_APPROVALS_DECIDE, decide)
    return json_response(encode(decided))


async def on_pause_run(request: web.Request) -> web.Response:
    """202: the run pauses at its next step boundary (`run.paused` in its events)."""
    run_id = identifier(request, "run_id")
    async with ingress_of(request).client(request) as client:
        pending = await client.call(ops.API_RUNS_PAUSE, RunPause(run_id=run_id))
    return json_response(encode(pending), status=200 if pending.status == "paused" else 202)


async def on_run_pending(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    async with ingress_of(request).client(request) as client:
        pending = await client.call(ops.API_RUNS_PENDING, RunPendingGet(run_id=run_id))
    return json_response(encode(pending))


async def on_edit_run(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    edit = decode_body(await request.read(), _EDIT, "edit")
    change = RunEdit(run_id=run_id, replace=edit.replace, drop=edit.drop, add=edit.add)
    async with ingress_of(request).client(request) as client:
        pending = await client.call(ops.API_RUNS_EDIT, change)
    return json_response(encode(pending))


async def on_resume_run(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    async with ingress_of(request).client(request) as client:
        pending = await client.call(ops.API_RUNS_RESUME, RunResume(run_id=run_id))
    return json_response(encode(pending))


async def on_fork_run(request: web.Request) -> web.Response:
    run_id = identifier(request, "run_id")
    fork = decode_body(await request.read(), _FORK, "fork")
    asked = RunFork(run_id=run_id, session_id=fork.session_id, checkpoint=fork.checkpoint)
    async with ingress_of(request).client(request) as client:
        forked = await client.call(ops.API_RUNS_FORK, asked)
    return json_response(encode(forked), status=201)


async def on_run_events(request: web.Request) -> web.StreamResponse:
    ingress = ingress_of(request)
    run_id = identifier(request, "run_id")
    after = _after(request)
    async with ingress.client(request) as client:
        # Over HTTP only the run's owner may read its events (not_found otherwise, as the API
        # answers), whatever the bus itself allows.
        info = await client.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        ended = info.record.status in ENDED
        timeout = REPLAY_TIMEOUT if ended else ingress.idle_timeout
        headers = {RUN_ID_HEADER: run_id}
        async with (
            aclosing(client.follow(run_id, after=after, timeout=timeout)) as events,
            aclosing(sse.with_keepalives(events, ingress.keepalive)) as paced,
        ):
            try:
                first = await anext(paced)
            except Unavailable:
                if not ended:
                    raise
                # 204 tells an EventSource to stop reconnecting: there is nothing left to send.
                return web.Response(status=204, headers=headers)
            # Every event is published inside the run's trace: the first names it for a run
            # started anywhere (the CLI, the SDK, another browser), not only through this route.
            if first is not None and first.trace_id:
                headers[TRACE_ID_HEADER] = first.trace_id
            return await stream(request, run_id, first, paced, headers)


async def stream(
    request: web.Request,
    run_id: str,
    first: SequencedEvent | None,
    paced: Paced,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Send `first` and the rest of `paced` as SSE (None: a keepalive) until the run ends."""
    response = await sse.open_stream(request, headers)
    last_seq = 0
    item = first
    try:
        while True:
            if item is None:
                await response.write(sse.KEEPALIVE)
            else:
                await response.write(sse.frame(item.seq, item.event))
                last_seq = item.seq
            item = await anext(paced)
    except StopAsyncIteration:
        pass  # the final event is sent
    except (ConnectionResetError, asyncio.CancelledError) as exc:
        # The client hung up (or the server is stopping): the run goes on without it, and it
        # can resume with `Last-Event-ID`.
        log.info("http_stream_closed", run_id=run_id, after=last_seq)
        if isinstance(exc, asyncio.CancelledError):
            raise
    except Unavailable as exc:
        # The status line is long gone: end the stream, the client resumes from its last id.
        log.warning("http_stream_idle", run_id=run_id, reason=exc.message)
    except Exception:
        log.exception("http_stream_failed", run_id=run_id, after=last_seq)
    return response


async def _final(events: Events, headers: dict[str, str]) -> web.Response:
    """Wait for the end of the run: `run.completed` as JSON, or the run's typed error."""
    final = None
    async for item in events:
        final = item.event
    match final:
        case RunCompleted():
            return json_response(encode(final), headers=headers)
        case RunFailed(error=error):
            return error_response(error, headers=headers)
        case (
            None
            | RunStarted()
            | RunApprovalRequested()
            | RunCompacted()
            | RunPaused()
            | RunResumed()
            | RunToolProgress()
        ):
            raise Unavailable("the event stream ended without a final event")
        case RunTextDelta() | RunToolCall() | RunToolResult():
            raise Unavailable("the event stream ended without a final event")
        case _:
            assert_never(final)


def _after(request: web.Request) -> int:
    """Resume point: `Last-Event-ID` (what an EventSource sends when it reconnects) wins over
    `?after=`."""
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "0"
    return sequence(raw, "event sequence")


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true")


def _wants_json(request: web.Request) -> bool:
    accept = request.headers.get(hdrs.ACCEPT, "")
    return "application/json" in accept and sse.CONTENT_TYPE not in accept
