"""A2A (Agent2Agent) over HTTP: each runbus agent the caller may run has its own endpoint,
`POST /v1/a2a/{agent}` (JSON-RPC 2.0), and its card at
`GET /v1/a2a/{agent}/.well-known/agent-card.json`.

The JSON-RPC methods of A2A 1.0 (`SendMessage`, `SendStreamingMessage`, `GetTask`, …) and their
A2A 0.3 names (`message/send`, `message/stream`, `tasks/get`, …) are both answered, the 0.3 ones
through the SDK's own v0.3 adapter. The bearer token, an agent the caller may not run and an
unreachable bus are HTTP answers, as on every route; everything about the call itself is a
JSON-RPC error with A2A's code.
"""

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Final

import msgspec
import pydantic
import structlog
from a2a.compat.v0_3 import types as v03
from a2a.compat.v0_3.request_handler import RequestHandler03
from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import JSONParseError, JSONRPCError
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.types import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    SendMessageRequest,
    SendMessageResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
)
from a2a.utils.constants import VERSION_HEADER
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    MethodNotFoundError,
    PushNotificationNotSupportedError,
    TaskNotFoundError,
    VersionNotSupportedError,
)
from a2a.utils.proto_utils import to_stream_response
from aiohttp import hdrs, web
from google.protobuf import json_format

from runbus import ops
from runbus.client import RunbusClient
from runbus.decoding import Undecodable, decode_untrusted
from runbus.errors import RunbusError, Unavailable, UnknownAgent
from runbus.messages import ErrorCode
from runbus.messages.runs import AgentList, AgentSummary

from . import sse
from .a2a_card import agent_card, card_document
from .a2a_handler import STATE_KEY, RunbusCall, RunbusRequestHandler, as_dict
from .bodies import bearer_token
from .context import identifier, ingress_of, json_response

log = structlog.get_logger()

HANDLER: Final = RunbusRequestHandler()
HANDLER_03: Final = RequestHandler03(HANDLER)

_HOST: Final = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
"""A host (and port) a forwarded header may name; anything else is ignored."""

SUPPORTED_VERSIONS: Final = frozenset({"0.3", "1.0"})
"""Major.minor versions of A2A a caller may name in `A2A-Version`."""

RequestId = str | int | None
Frames = AsyncGenerator[dict[str, Any], None]
"""A streaming method's answers, each a whole JSON-RPC response object."""


class JsonRpcRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A JSON-RPC 2.0 request to an agent's A2A endpoint; `params` is the A2A method's request
    (A2A 1.0's or 0.3's, by the method's name)."""

    jsonrpc: str
    method: str
    id: str | int | None = None
    params: dict[str, Any] = {}


_ENVELOPE = msgspec.json.Decoder(JsonRpcRequest)

_V1_UNARY: Final[dict[str, type[Any]]] = {
    "SendMessage": SendMessageRequest,
    "GetTask": GetTaskRequest,
    "CancelTask": CancelTaskRequest,
    "ListTasks": ListTasksRequest,
    "CreateTaskPushNotificationConfig": TaskPushNotificationConfig,
    "GetTaskPushNotificationConfig": GetTaskPushNotificationConfigRequest,
    "ListTaskPushNotificationConfigs": ListTaskPushNotificationConfigsRequest,
    "DeleteTaskPushNotificationConfig": DeleteTaskPushNotificationConfigRequest,
    "GetExtendedAgentCard": GetExtendedAgentCardRequest,
}
_V1_STREAMING: Final[dict[str, type[Any]]] = {
    "SendStreamingMessage": SendMessageRequest,
    "SubscribeToTask": SubscribeToTaskRequest,
}
_V03_METHODS: Final[dict[str, type[pydantic.BaseModel]]] = {
    "message/send": v03.SendMessageRequest,
    "message/stream": v03.SendStreamingMessageRequest,
    "tasks/get": v03.GetTaskRequest,
    "tasks/cancel": v03.CancelTaskRequest,
    "tasks/resubscribe": v03.TaskResubscriptionRequest,
}
_V03_PUSH: Final = frozenset(
    {
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
    }
)
METHODS: Final = frozenset({*_V1_UNARY, *_V1_STREAMING, *_V03_METHODS, *_V03_PUSH})
STREAMING: Final = frozenset({*_V1_STREAMING, "message/stream", "tasks/resubscribe"})
"""Methods answered as Server-Sent Events."""

ERROR_BY_CODE: Final[dict[ErrorCode, type[A2AError]]] = {
    "bad_request": InvalidParamsError,
    "not_found": TaskNotFoundError,
}
"""runbus errors about the call itself, as A2A errors; the others (token, agent, bus) are
answered as HTTP errors by the ingress's error middleware."""


async def on_agent_card(request: web.Request) -> web.Response:
    agent = identifier(request, "agent")
    async with ingress_of(request).client(request) as client:
        summary = await _agent(client, agent)
    return json_response(card_document(agent_card(summary, public_base(request))))


def public_base(request: web.Request) -> str:
    """Scheme, host and port as the caller reached the ingress: a proxy in front that
    terminates TLS or renames the host says so in `X-Forwarded-Proto` / `X-Forwarded-Host`
    (the card names the endpoint the caller is to use; it grants nothing)."""
    scheme = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip()
    host = request.headers.get("X-Forwarded-Host", "").split(",")[0].strip()
    if scheme not in ("http", "https"):
        scheme = request.scheme
    if not _HOST.fullmatch(host):
        host = request.host
    return f"{scheme}://{host}"


async def on_rpc(request: web.Request) -> web.StreamResponse:
    bearer_token(request.headers.get(hdrs.AUTHORIZATION))  # 401 before anything is read
    agent = identifier(request, "agent")
    ingress = ingress_of(request)
    try:
        envelope = decode_untrusted(_ENVELOPE, await request.read(), "JSON-RPC request")
    except Undecodable as exc:
        return _error(None, _envelope_error(exc))
    request_id = envelope.id
    try:
        _check(request, envelope)
    except A2AError as exc:
        return _error(request_id, exc)
    async with ingress.client(request) as client:
        await _agent(client, agent)
        state = {STATE_KEY: RunbusCall(client, agent, ingress.idle_timeout)}
        context = ServerCallContext(state=state)
        try:
            if envelope.method in STREAMING:
                frames = _stream(envelope, context)
                first = await anext(frames)
            else:
                return json_response(await _unary(envelope, context))
        except (A2AError, RunbusError) as exc:
            return _error(request_id, _a2a_error(exc))
        return await _send_stream(request, request_id, first, frames)


async def _agent(client: RunbusClient, agent: str) -> AgentSummary:
    """The agent, if the caller may run it; `unknown_agent` (404) otherwise."""
    listed = await client.call(ops.API_AGENTS_LIST, AgentList())
    for summary in listed.agents:
        if summary.name == agent:
            return summary
    raise UnknownAgent(f"no agent {agent!r} for this caller")


def _check(request: web.Request, envelope: JsonRpcRequest) -> None:
    if envelope.jsonrpc != "2.0":
        raise InvalidRequestError('`jsonrpc` must be exactly "2.0"')
    if envelope.method not in METHODS:
        raise MethodNotFoundError(f"no A2A method {envelope.method!r}")
    asked = request.headers.get(VERSION_HEADER, "").strip()
    if asked and ".".join(asked.split(".")[:2]) not in SUPPORTED_VERSIONS:
        raise VersionNotSupportedError(
            f"A2A-Version {asked!r}: this endpoint speaks {', '.join(sorted(SUPPORTED_VERSIONS))}"
        )


def _envelope_error(exc: Undecodable) -> A2AError | JSONRPCError:
    if exc.malformed:
        return JSONParseError(message=exc.reason)
    return InvalidRequestError(f"not a JSON-RPC 2.0 request: {exc.reason}")


def _params(envelope: JsonRpcRequest, model: type[Any]) -> Any:
    """The method's A2A 1.0 request (protobuf) from `params`."""
    try:
        return json_format.ParseDict(envelope.params, model(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise InvalidParamsError(f"bad params for {envelope.method}: {exc}") from None


def _params_03(envelope: JsonRpcRequest) -> Any:
    """The method's A2A 0.3 request (the whole JSON-RPC request, as the SDK's v0.3 types are)."""
    try:
        return _V03_METHODS[envelope.method].model_validate(msgspec.to_builtins(envelope))
    except pydantic.ValidationError as exc:
        raise InvalidParamsError(
            f"bad params for {envelope.method}: {exc.errors(include_url=False)}"
        ) from None


def _result(request_id: RequestId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _dump_03(model: pydantic.BaseModel) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def _unary(envelope: JsonRpcRequest, context: ServerCallContext) -> dict[str, Any]:
    method, request_id = envelope.method, envelope.id
    if method in _V03_PUSH:
        raise PushNotificationNotSupportedError
    if method in _V03_METHODS:
        request = _params_03(envelope)
        answer_03: pydantic.BaseModel
        match method:
            case "message/send":
                answer_03 = await HANDLER_03.on_message_send(request, context)
            case "tasks/get":
                answer_03 = await HANDLER_03.on_get_task(request, context)
            case _:
                answer_03 = await HANDLER_03.on_cancel_task(request, context)
        return _result(request_id, _dump_03(answer_03))
    request = _params(envelope, _V1_UNARY[method])
    match method:
        case "SendMessage":
            sent = await HANDLER.on_message_send(request, context)
            response = (
                SendMessageResponse(task=sent)
                if isinstance(sent, Task)
                else SendMessageResponse(message=sent)
            )
            return _result(request_id, as_dict(response))
        case "GetTask":
            return _result(request_id, as_dict(await HANDLER.on_get_task(request, context)))
        case "CancelTask":
            return _result(request_id, as_dict(await HANDLER.on_cancel_task(request, context)))
        case "ListTasks":
            return _result(request_id, as_dict(await HANDLER.on_list_tasks(request, context)))
        case "GetExtendedAgentCard":
            await HANDLER.on_get_extended_agent_card(request, context)
    raise PushNotificationNotSupportedError


async def _stream(envelope: JsonRpcRequest, context: ServerCallContext) -> Frames:
    method, request_id = envelope.method, envelope.id
    if method in _V03_METHODS:
        request_03 = _params_03(envelope)
        stream_03 = (
            HANDLER_03.on_message_send_stream(request_03, context)
            if method == "message/stream"
            else HANDLER_03.on_subscribe_to_task(request_03, context)
        )
        async for item in stream_03:
            yield _dump_03(item)
        return
    request = _params(envelope, _V1_STREAMING[method])
    events = (
        HANDLER.on_message_send_stream(request, context)
        if method == "SendStreamingMessage"
        else HANDLER.on_subscribe_to_task(request, context)
    )
    async with aclosing(events):
        async for event in events:
            yield _result(request_id, as_dict(to_stream_response(event)))


def _a2a_error(exc: A2AError | RunbusError) -> A2AError:
    if isinstance(exc, A2AError):
        return exc
    error = _as_a2a(exc)
    if error is None:
        raise exc  # the ingress's typed HTTP error
    return error(exc.message)


def _error(request_id: RequestId, error: A2AError | JSONRPCError) -> web.Response:
    return json_response(build_error_response(request_id, error))


async def _send_stream(
    request: web.Request, request_id: RequestId, first: dict[str, Any], frames: Frames
) -> web.StreamResponse:
    """`first` and the rest of `frames` as SSE, one JSON-RPC response per event; an error after
    the status line is an `error` event holding a JSON-RPC error response."""
    ingress = ingress_of(request)
    response = await sse.open_stream(request, {})
    async with aclosing(frames), aclosing(sse.with_keepalives(frames, ingress.keepalive)) as paced:
        item: dict[str, Any] | None = first
        try:
            while True:
                if item is None:
                    await response.write(sse.KEEPALIVE)
                else:
                    await response.write(sse.data_frame(json.dumps(item).encode()))
                item = await anext(paced)
        except StopAsyncIteration:
            pass
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            # The client hung up (or the server is stopping): the run goes on without it.
            log.info("a2a_stream_closed")
            if isinstance(exc, asyncio.CancelledError):
                raise
        except Exception as exc:
            if isinstance(exc, Unavailable):
                log.warning("a2a_stream_idle", reason=exc.message)
            elif not isinstance(exc, A2AError | RunbusError):
                log.exception("a2a_stream_failed")
            error = _stream_error(exc)
            frame = json.dumps(build_error_response(request_id, error)).encode()
            await response.write(sse.data_frame(frame, event="error"))
    return response


def _as_a2a(exc: RunbusError) -> type[A2AError] | None:
    code = exc.to_info().known_code
    return None if code is None else ERROR_BY_CODE.get(code)


def _stream_error(exc: Exception) -> A2AError:
    if isinstance(exc, A2AError):
        return exc
    if isinstance(exc, RunbusError):
        return (_as_a2a(exc) or InternalError)(exc.message)
    return InternalError("internal error")
