"""`POST /v1/mcp`: each agent the caller may run as an MCP tool, a call a run as the bearer
token's user. The `mcp` SDK's own stateless server speaks the protocol (behind `_asgi`); this
module authenticates, lists the agents and runs them."""

import uuid
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, assert_never

import anyio
import mcp_types as types
import msgspec
import structlog
from aiohttp import hdrs, web
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from starlette.requests import Request

from runbus import __version__, ops
from runbus.client import RunbusClient, new_run_id
from runbus.decoding import Undecodable, decode_untrusted
from runbus.errors import BadRequest, RunbusError, Unavailable
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
    is_identifier,
)
from runbus.messages.runs import AgentList, RunCancel

from . import _asgi
from .bodies import bearer_token
from .context import ingress_of

log = structlog.get_logger()

CALLER_KEY: Final = "runbus.mcp_caller"
"""Key of the ASGI scope that carries the authenticated caller to the SDK's handlers."""
META_PREFIX: Final = "runbus/"
"""Prefix of the `_meta` keys of a tool result (`runbus/run_id`, `runbus/session_id`)."""
CANCEL_TIMEOUT: Final = 5.0
"""Seconds the cancel of an abandoned call's run may take."""

INPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "input": {
            "type": "string",
            "minLength": 1,
            "description": "What the user says to the agent.",
        },
        "session_id": {
            "type": "string",
            "pattern": "^[A-Za-z0-9_-]{1,128}$",
            "description": "The conversation to continue (the caller's own); a new one when"
            " absent. Each result names its session in `_meta['runbus/session_id']`.",
        },
    },
    "required": ["input"],
    "additionalProperties": False,
}
"""Every agent tool's arguments (what `ToolArguments` decodes)."""


class ToolArguments(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The arguments of a `tools/call` of an agent: `INPUT_SCHEMA`."""

    input: Annotated[str, msgspec.Meta(min_length=1)]
    """The user message the run starts with."""
    session_id: Identifier | None = None
    """The caller's session to continue; a new one when absent."""


_ARGUMENTS = msgspec.json.Decoder(ToolArguments)


class JsonRpcErrorData(msgspec.Struct, frozen=True):
    code: int
    message: str
    data: Any = None


class JsonRpcMessage(msgspec.Struct, frozen=True, kw_only=True):
    """What a client may post: a request, a notification (no `id`), or its response or error
    to a request of the server's. Checked here so that a body the SDK would refuse is refused
    as every route refuses a bad body; the SDK then reads it again."""

    jsonrpc: Literal["2.0"]
    id: str | int | None = None
    method: str | None = None
    params: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: JsonRpcErrorData | None = None

    def check(self) -> None:
        kinds = [k for k in ("method", "result", "error") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise BadRequest("a JSON-RPC message has exactly one of `method`, `result`, `error`")
        if self.result is not None and self.id is None:
            raise BadRequest("a JSON-RPC response names the request's `id`")


_MESSAGE = msgspec.json.Decoder(JsonRpcMessage)


Owner = tuple[str, str]
"""(tenant, user_id)."""


@dataclass(frozen=True)
class Caller:
    """Who an MCP request is from: their own bus client and identity, from the bearer token of
    the HTTP request (never from anything in the MCP message)."""

    client: RunbusClient
    tenant: str
    user_id: str
    idle_timeout: float
    """Seconds a call waits for the next event of its run."""

    @property
    def owner(self) -> Owner:
        return self.tenant, self.user_id


@dataclass
class InFlight:
    """The runs of the tool calls being answered, by owner and JSON-RPC request id: what a
    `notifications/cancelled` (an HTTP request of its own in the 2025 handshake) names."""

    runs: dict[tuple[Owner, types.RequestId], set[str]] = field(default_factory=dict)

    @contextmanager
    def holding(self, owner: Owner, request_id: types.RequestId, run_id: str) -> Iterator[None]:
        key = (owner, request_id)
        self.runs.setdefault(key, set()).add(run_id)
        try:
            yield
        finally:
            held = self.runs[key]
            held.discard(run_id)
            if not held:
                del self.runs[key]

    def named(self, owner: Owner, request_id: types.RequestId) -> set[str]:
        """The owner's runs of calls with this request id (another owner's are never named)."""
        return set(self.runs.get((owner, request_id), ()))


IN_FLIGHT: Final = InFlight()


def caller_of(ctx: ServerRequestContext[Any, Any]) -> Caller:
    request = ctx.request
    caller = request.scope.get(CALLER_KEY) if isinstance(request, Request) else None
    if not isinstance(caller, Caller):
        raise MCPError(types.INTERNAL_ERROR, "no authenticated caller on this request")
    return caller


async def on_list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    caller = caller_of(ctx)
    listed = await caller.client.call(ops.API_AGENTS_LIST, AgentList())
    tools = [
        types.Tool(
            name=agent.name,
            description=agent.description or f"The runbus agent {agent.name!r}.",
            input_schema=INPUT_SCHEMA,
        )
        for agent in listed.agents
    ]
    # Each caller has their own list: `private`, and no freshness promised.
    return types.ListToolsResult(tools=tools, cache_scope="private", ttl_ms=0)


async def on_call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    caller = caller_of(ctx)
    agent = params.name
    if not is_identifier(agent):  # it becomes part of the run request's subject
        raise MCPError(types.INVALID_PARAMS, f"no tool {agent!r} for this caller")
    arguments = _arguments(params.arguments)
    run_id = new_run_id()
    session_id = arguments.session_id or f"s-{uuid.uuid4().hex[:16]}"
    meta: dict[str, Any] = {
        f"{META_PREFIX}run_id": run_id,
        f"{META_PREFIX}session_id": session_id,
    }
    try:
        _, trace_id = await caller.client.start_traced(
            agent, arguments.input, session_id=session_id, run_id=run_id
        )
    except RunbusError as exc:
        return _failed(exc.to_info().code, exc.message, meta)
    meta[f"{META_PREFIX}trace_id"] = trace_id
    log.info("mcp_run_started", run_id=run_id, agent=agent, user_id=caller.user_id)
    request_id = ctx.request_id if ctx.request_id is not None else run_id
    with IN_FLIGHT.holding(caller.owner, request_id, run_id):
        try:
            return await _settle(ctx, caller, agent, run_id, meta)
        except RunbusError as exc:
            return _failed(exc.to_info().code, exc.message, meta)
        except anyio.get_cancelled_exc_class():
            # The client abandoned the call (closed its stream, or cancelled it): so is the run.
            await _cancel(caller, run_id)
            raise


async def _settle(
    ctx: ServerRequestContext[Any, Any],
    caller: Caller,
    agent: str,
    run_id: str,
    meta: dict[str, Any],
) -> types.CallToolResult:
    """Follow the run to its answer, reporting its steps as progress (when the client asked)."""
    steps = 0
    tools: dict[str, str] = {}
    events = caller.client.follow(run_id, timeout=caller.idle_timeout)
    async with aclosing(events):
        async for item in events:
            event = item.event
            note: str | None = None
            match event:
                case RunCompleted(text=answer):
                    log.info("mcp_run_completed", run_id=run_id)
                    return _result(answer, meta)
                case RunFailed(error=error):
                    log.info("mcp_run_failed", run_id=run_id, code=error.code)
                    if error.code == "unknown_agent":
                        raise MCPError(types.INVALID_PARAMS, f"no tool {agent!r} for this caller")
                    return _failed(error.code, error.message, meta)
                case RunApprovalRequested(call_id=call_id, tool=tool, reason=reason):
                    # Waiting here could outlast any client's timeout: the client is told now,
                    # and a person decides through the run API.
                    log.info("mcp_run_awaits_approval", run_id=run_id, call_id=call_id)
                    text = (
                        f"approval pending: run {run_id} waits for a person's approval of"
                        f" {tool} (call {call_id}): {reason}. Decide with POST"
                        f" /v1/runs/{run_id}/approvals/{call_id}; the answer then arrives on"
                        f" GET /v1/runs/{run_id}/events."
                    )
                    pending = {**meta, f"{META_PREFIX}call_id": call_id}
                    return _result(text, pending, is_error=True)
                case RunStarted():
                    note = f"run {run_id} started"
                case RunToolCall(call=call):
                    tools[call.call_id] = call.name
                    note = f"calling {call.name}"
                case RunToolResult(result=result):
                    name = tools.get(result.call_id, "a tool")
                    note = f"{name} failed" if result.error else f"{name} answered"
                case RunTextDelta(delta=delta):
                    note = delta
                case RunToolProgress(tool=tool, state=state, text=said):
                    note = f"{tool}: {said or state}"
                case RunCompacted() | RunPaused() | RunResumed():
                    note = "history compacted"
                case _:
                    assert_never(event)
            steps += 1
            await ctx.session.report_progress(steps, None, note)
    raise Unavailable(f"the events of run {run_id} ended without a final event")


async def on_cancelled(caller: Caller, message: JsonRpcMessage) -> None:
    """A `notifications/cancelled` cancels the runs of the caller's calls it names. Stateless,
    the SDK acknowledges a notification and drops it with its request; so it is acted on here,
    before the acknowledgement, and only ever on the caller's own calls."""
    request_id = cancelled_request_id_from_params(message.params)
    if request_id is not None:
        for run_id in IN_FLIGHT.named(caller.owner, request_id):
            await _cancel(caller, run_id)


async def _cancel(caller: Caller, run_id: str) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT):
        try:
            await caller.client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        except RunbusError as exc:  # it ended meanwhile: nothing left to cancel
            log.info("mcp_run_cancel_refused", run_id=run_id, code=exc.to_info().code)
            return
    log.info("mcp_run_cancelled", run_id=run_id)


def _arguments(arguments: dict[str, Any] | None) -> ToolArguments:
    try:
        return decode_untrusted(_ARGUMENTS, msgspec.json.encode(arguments or {}), "tool arguments")
    except Undecodable as exc:
        raise MCPError(types.INVALID_PARAMS, exc.message) from None


def _failed(code: str, message: str, meta: dict[str, Any]) -> types.CallToolResult:
    return _result(f"{code}: {message}", meta, is_error=True)


def _result(text: str, meta: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(text=text)]
    return types.CallToolResult(content=content, is_error=is_error, _meta=meta)


SERVER: Final = Server(
    "runbus",
    version=__version__,
    instructions="Each tool is a runbus agent; a call runs it and answers with its final text.",
    # Every agent takes the same arguments: the 2026-07-28 envelope's header check needs no
    # per-caller tool list.
    get_tool_input_schema=lambda _name: INPUT_SCHEMA,
    on_list_tools=on_list_tools,
    on_call_tool=on_call_tool,
)


async def on_mcp(request: web.Request) -> web.StreamResponse:
    bearer_token(request.headers.get(hdrs.AUTHORIZATION))  # 401 before anything is read
    message = decode_untrusted(_MESSAGE, await request.read(), "MCP message")
    message.check()
    ingress = ingress_of(request)
    async with ingress.client(request) as client:
        me = await client.identity()  # an unknown token is a 401 here too, not an MCP error
        caller = Caller(client, me.tenant, me.user_id, ingress.idle_timeout)
        if message.method == "notifications/cancelled" and message.id is None:
            await on_cancelled(caller, message)
        # Stateless: any ingress replica answers any request, and nothing is kept between
        # them; the manager lives as long as this request (0.09 ms to make and start). A tool
        # call is answered as SSE, which carries its progress and keeps a long run's answer
        # alive through proxies; anything else as plain JSON, a millisecond sooner.
        manager = StreamableHTTPSessionManager(
            SERVER, stateless=True, json_response=message.method != "tools/call"
        )
        async with manager.run():
            return await _asgi.serve(manager.handle_request, request, {CALLER_KEY: caller})
