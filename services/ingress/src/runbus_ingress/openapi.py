"""The OpenAPI 3.1 document of every route, built from the same types the handlers decode and
encode (a test checks it names exactly the routes the app serves)."""

from functools import cache
from typing import Final

import msgspec
from ag_ui import core as ag
from aiohttp import web

from runbus.messages import ErrorReply, HistoryLoaded, RunCompleted
from runbus.messages.memory import MemoryForgotten, MemoryListed
from runbus.messages.runs import (
    AgentListed,
    ApprovalDecided,
    RunForked,
    RunListed,
    RunPending,
    RunRecord,
)
from runbus.messages.sessions import SessionListed, SessionRecord

from . import openai_wire as oa
from ._openapi_paths import AGUI_PREFIX, REF, paths
from .a2a_routes import JsonRpcRequest
from .bodies import StartRun
from .errors import OpenAIErrorBody
from .resources import Me
from .responses import ResponseRequest
from .runs import Decision, Detached, Edit, Fork

_TYPES: Final = (
    StartRun,
    Detached,
    Decision,
    Edit,
    Fork,
    RunPending,
    RunForked,
    RunRecord,
    RunListed,
    RunCompleted,
    ApprovalDecided,
    Me,
    AgentListed,
    SessionListed,
    SessionRecord,
    HistoryLoaded,
    MemoryListed,
    MemoryForgotten,
    ErrorReply,
    OpenAIErrorBody,
    oa.ChatCompletionRequest,
    oa.ChatCompletion,
    oa.Model,
    oa.ModelList,
    ResponseRequest,
    JsonRpcRequest,
)


@cache
def document() -> bytes:
    _, components = msgspec.json.schema_components(_TYPES, ref_template=REF)
    agui = ag.RunAgentInput.model_json_schema(
        ref_template=REF.replace("{name}", AGUI_PREFIX + "{model}")
    )
    for name, schema in agui.pop("$defs", {}).items():
        components[AGUI_PREFIX + name] = schema
    components[f"{AGUI_PREFIX}RunAgentInput"] = agui
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "runbus HTTP ingress",
            "version": "1",
            "description": "runbus's run API, OpenAI-compatible, AG-UI and A2A endpoints.",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths(),
    }
    return msgspec.json.encode(doc)


async def on_openapi(request: web.Request) -> web.Response:
    return web.Response(body=document(), content_type="application/json")
