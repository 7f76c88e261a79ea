"""The paths of the OpenAPI document: one entry per route of `app.ROUTES`, its parameters,
body and answers by schema name."""

from typing import Any, Final

REF: Final = "#/components/schemas/{name}"
AGUI_PREFIX: Final = "AgUi"
JSON: Final = "application/json"
SSE: Final = "text/event-stream"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


def _body(name: str, media: str = JSON) -> dict[str, Any]:
    return {"required": True, "content": {media: {"schema": _ref(name)}}}


def _ok(description: str, name: str | None = None, media: str = JSON) -> dict[str, Any]:
    schema = _ref(name) if name else {"type": "string"}
    return {"description": description, "content": {media: {"schema": schema}}}


def _errors(*statuses: int, openai: bool = False) -> dict[str, Any]:
    name = "OpenAIErrorBody" if openai else "ErrorReply"
    described = {
        400: "bad request",
        401: "missing or unknown bearer token",
        404: "no such thing for this caller (another user's is the same)",
        409: "conflict (session busy, run cancelled, …)",
        413: "body too large",
        503: "the bus or a service is unavailable",
    }
    return {str(s): _ok(described[s], name) for s in statuses}


RUN_HEADERS: Final = {
    "Runbus-Run-Id": {
        "description": "the run",
        "schema": {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,128}$"},
    },
    "Runbus-Trace-Id": {
        "description": "the run's trace id (Jaeger's `/trace/<id>`), whoever started the run;"
        " absent when its events carry no trace context",
        "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
    },
}


def _with_run_headers(response: dict[str, Any]) -> dict[str, Any]:
    return {**response, "headers": RUN_HEADERS}


def _param(name: str, where: str = "path", **schema: Any) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema or {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,128}$"},
    }


def _op(
    summary: str,
    responses: dict[str, Any],
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    secured: bool = True,
    tag: str = "runs",
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "responses": responses}
    if body:
        op["requestBody"] = body
    if params:
        op["parameters"] = params
    if not secured:
        op["security"] = []
    return op


def _example(body: dict[str, Any], example: object) -> dict[str, Any]:
    body["content"][JSON]["example"] = example
    return body


RUN_ID = _param("run_id")
# The fuzzer's explicit phase then calls a real agent's A2A endpoint, not only unknown ones.
A2A_AGENT = {**_param("agent"), "example": "travel"}
A2A_EXAMPLE = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "r-none"}}
COMMON = (400, 401, 404, 503)
MCP_EXAMPLE = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
JSON_RPC_MESSAGE: Final = {
    "type": "object",
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["string", "integer"]},
        "method": {"type": "string"},
        "params": {"type": "object"},
    },
    "required": ["jsonrpc"],
}
"""An MCP message: a request, a notification (no `id`) or a response to the server."""
JSON_RPC_ERROR: Final = {
    "type": "object",
    "properties": {
        "jsonrpc": {"const": "2.0"},
        "id": {"type": ["string", "integer", "null"]},
        "error": {
            "type": "object",
            "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
            "required": ["code", "message"],
        },
    },
    "required": ["jsonrpc", "error"],
}


def _json_rpc_error(description: str) -> dict[str, Any]:
    """The MCP endpoint's refusals of a message: the SDK's JSON-RPC error, by HTTP status."""
    return {"description": description, "content": {JSON: {"schema": JSON_RPC_ERROR}}}


def paths() -> dict[str, dict[str, Any]]:
    sse_or_json = {
        "200": _with_run_headers(
            {
                "description": "the run's events as SSE, or `run.completed` with `?wait=true`",
                "content": {
                    SSE: {"schema": {"type": "string"}},
                    JSON: {"schema": _ref("RunCompleted")},
                },
            }
        ),
        "202": _with_run_headers(_ok("with `?detach=true`: the run is on its way", "Detached")),
    }
    flags = [_param(f, "query", type="string", enum=["true", "false"]) for f in ("wait", "detach")]
    return {
        "/v1/runs": {
            "post": _op(
                "Start a run",
                {**sse_or_json, **_errors(*COMMON, 409, 413)},
                body=_body("StartRun"),
                params=flags,
            ),
            "get": _op(
                "List the caller's runs",
                {"200": _ok("newest first", "RunListed"), **_errors(*COMMON)},
                params=[
                    _param("session_id", "query", type="string"),
                    _param("parent_run_id", "query", type="string"),
                    _param("limit", "query", type="integer", minimum=1, maximum=1000),
                ],
            ),
        },
        "/v1/runs/{run_id}": {
            "get": _op(
                "Read a run",
                {"200": _ok("the run", "RunRecord"), **_errors(*COMMON)},
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/events": {
            "get": _op(
                "Replay then follow a run's events",
                {
                    "200": _with_run_headers(
                        _ok("SSE: `id` sequence, `event` type, `data` JSON", media=SSE)
                    ),
                    "204": {"description": "the run has ended and nothing is left"},
                    **_errors(*COMMON),
                },
                params=[RUN_ID, _param("after", "query", type="integer", minimum=0)],
            ),
        },
        "/v1/runs/{run_id}/cancel": {
            "post": _op(
                "Cancel a run",
                {
                    "200": _ok("it had ended", "RunRecord"),
                    "202": _ok("on its way", "RunRecord"),
                    **_errors(*COMMON),
                },
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/approvals/{call_id}": {
            "post": _op(
                "Approve or deny a waiting call",
                {
                    "200": _ok("the decision that stands", "ApprovalDecided"),
                    **_errors(*COMMON, 409),
                },
                body=_body("Decision"),
                params=[RUN_ID, _param("call_id")],
            )
        },
        "/v1/runs/{run_id}/pause": {
            "post": _op(
                "Pause a run at its next step boundary",
                {
                    "200": _ok("it is paused", "RunPending"),
                    "202": _ok("it pauses at its next step boundary", "RunPending"),
                    **_errors(*COMMON, 409),
                },
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/pending": {
            "get": _op(
                "A paused run's pending calls and messages",
                {"200": _ok("what it does next", "RunPending"), **_errors(*COMMON, 409)},
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/edit": {
            "post": _op(
                "Edit a paused run's pending step (it stays paused)",
                {"200": _ok("the pending step as edited", "RunPending"), **_errors(*COMMON, 409)},
                body=_body("Edit"),
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/resume": {
            "post": _op(
                "Resume a paused run, as edited",
                {"200": _ok("it goes on", "RunPending"), **_errors(*COMMON, 409)},
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/fork": {
            "post": _op(
                "Fork a run from one of its checkpoints into a new session",
                {"201": _ok("the new session", "RunForked"), **_errors(*COMMON, 409)},
                body=_body("Fork"),
                params=[RUN_ID],
            )
        },
        "/v1/runs/{run_id}/agui": {
            "get": _op(
                "A run's events as AG-UI",
                {"200": _ok("AG-UI events as SSE", media=SSE), **_errors(*COMMON)},
                params=[RUN_ID],
                tag="ag-ui",
            )
        },
        "/v1/agui/{agent}": {
            "post": _op(
                "Run an agent, AG-UI in and out",
                {"200": _ok("AG-UI events as SSE", media=SSE), **_errors(*COMMON, 409, 413)},
                body=_body(f"{AGUI_PREFIX}RunAgentInput"),
                params=[_param("agent")],
                tag="ag-ui",
            )
        },
        "/v1/a2a/{agent}": {
            "post": _op(
                "A2A JSON-RPC: SendMessage, SendStreamingMessage, GetTask, CancelTask, ListTasks,"
                " SubscribeToTask (and the A2A 0.3 names message/send, message/stream, tasks/get,"
                " tasks/cancel, tasks/resubscribe)",
                {
                    "200": {
                        "description": "a JSON-RPC response (an A2A error is one too), or JSON-RPC"
                        " responses as SSE for the streaming methods",
                        "content": {
                            JSON: {"schema": {"type": "object"}},
                            SSE: {"schema": {"type": "string"}},
                        },
                    },
                    **_errors(400, 401, 404, 413, 503),
                },
                body=_example(_body("JsonRpcRequest"), A2A_EXAMPLE),
                params=[A2A_AGENT],
                tag="a2a",
            )
        },
        "/v1/a2a/{agent}/.well-known/agent-card.json": {
            "get": _op(
                "The agent's A2A agent card",
                {"200": _ok("the AgentCard", None, JSON), **_errors(*COMMON)},
                params=[A2A_AGENT],
                tag="a2a",
            )
        },
        "/v1/mcp": {
            "post": _op(
                "MCP (streamable HTTP, stateless): each agent the caller may run is a tool;"
                " tools/call runs it as the caller and answers with its final text",
                {
                    "200": {
                        "description": "a JSON-RPC response, or SSE carrying progress"
                        " notifications and then the response",
                        "content": {
                            JSON: {"schema": {"type": "object"}},
                            SSE: {"schema": {"type": "string"}},
                        },
                    },
                    "202": {"description": "a notification, accepted"},
                    "400": {
                        "description": "not a JSON-RPC message (runbus's `bad_request`), or one"
                        " the MCP server refuses (a JSON-RPC error)",
                        "content": {
                            JSON: {"schema": {"oneOf": [_ref("ErrorReply"), JSON_RPC_ERROR]}}
                        },
                    },
                    "406": _json_rpc_error("`Accept` lacks application/json or text/event-stream"),
                    **_errors(401, 413, 503),
                },
                body=_example(
                    {"required": True, "content": {JSON: {"schema": JSON_RPC_MESSAGE}}},
                    MCP_EXAMPLE,
                ),
                tag="mcp",
            )
        },
        "/v1/me": {
            "get": _op(
                "Who the caller's token stands for (user and tenant)",
                {"200": _ok("the caller", "Me"), **_errors(401, 503)},
                tag="resources",
            )
        },
        "/v1/agents": {
            "get": _op(
                "The agents the caller may run",
                {"200": _ok("by name", "AgentListed"), **_errors(401, 503)},
                tag="resources",
            )
        },
        "/v1/sessions": {
            "get": _op(
                "The caller's sessions",
                {"200": _ok("newest first", "SessionListed"), **_errors(400, 401, 503)},
                params=[_param("limit", "query", type="integer", minimum=1, maximum=1000)],
                tag="resources",
            )
        },
        "/v1/sessions/{session_id}": {
            "get": _op(
                "Read a session",
                {"200": _ok("the record", "SessionRecord"), **_errors(*COMMON)},
                params=[_param("session_id")],
                tag="resources",
            )
        },
        "/v1/sessions/{session_id}/messages": {
            "get": _op(
                "A session's transcript",
                {"200": _ok("its history", "HistoryLoaded"), **_errors(*COMMON)},
                params=[_param("session_id")],
                tag="resources",
            )
        },
        "/v1/memories": {
            "get": _op(
                "The caller's memories",
                {"200": _ok("a page", "MemoryListed"), **_errors(*COMMON)},
                params=[
                    _param("session_id", "query", type="string"),
                    _param("cursor", "query", type="string"),
                    _param("limit", "query", type="integer", minimum=1, maximum=1000),
                ],
                tag="resources",
            )
        },
        "/v1/memories/{memory_id}": {
            "delete": _op(
                "Forget a memory",
                {"200": _ok("forgotten", "MemoryForgotten"), **_errors(*COMMON)},
                params=[_param("memory_id")],
                tag="resources",
            )
        },
        "/v1/chat/completions": {
            "post": _op(
                "OpenAI Chat Completions (model = agent)",
                {
                    "200": {
                        "description": "a completion, or chunks as SSE with `stream`",
                        "content": {
                            JSON: {"schema": _ref("ChatCompletion")},
                            SSE: {"schema": {"type": "string"}},
                        },
                    },
                    **_errors(*COMMON, 409, 413, openai=True),
                },
                body=_body("ChatCompletionRequest"),
                tag="openai",
            )
        },
        "/v1/models": {
            "get": _op(
                "OpenAI model list (the caller's agents)",
                {"200": _ok("the agents", "ModelList"), **_errors(401, 503, openai=True)},
                tag="openai",
            )
        },
        "/v1/models/{model}": {
            "get": _op(
                "OpenAI model (one of the caller's agents)",
                {"200": _ok("the agent", "Model"), **_errors(401, 404, 503, openai=True)},
                params=[{**_param("model", type="string"), "example": "travel"}],
                tag="openai",
            )
        },
        "/v1/responses": {
            "post": _op(
                "OpenAI Responses (subset)",
                {
                    "200": {
                        "description": "a response, or its events as SSE with `stream`",
                        "content": {
                            JSON: {"schema": {"type": "object"}},
                            SSE: {"schema": {"type": "string"}},
                        },
                    },
                    **_errors(*COMMON, 409, 413, openai=True),
                },
                body=_body("ResponseRequest"),
                tag="openai",
            )
        },
        "/openapi.json": {
            "get": _op(
                "This document", {"200": _ok("OpenAPI 3.1", None, JSON)}, secured=False, tag="meta"
            )
        },
        "/healthz": {
            "get": _op("Liveness", {"200": _ok("alive", None, JSON)}, secured=False, tag="meta")
        },
        "/": {
            "get": _op(
                "The web console",
                {"200": _ok("HTML", media="text/html")},
                secured=False,
                tag="console",
            )
        },
        "/console/{asset}": {
            "get": _op(
                "A console asset",
                {"200": _ok("the file", media="application/octet-stream"), **_errors(404)},
                params=[_param("asset", type="string")],
                secured=False,
                tag="console",
            )
        },
    }
