"""The ingress application: every route in one table, the typed-error middleware, and the
per-user connections started and closed with the app."""

from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from . import (
    a2a_routes,
    agui,
    console,
    mcp_endpoint,
    openai_chat,
    openapi,
    resources,
    responses,
    runs,
)
from .connections import UserConnections
from .context import INGRESS_KEY, Ingress, json_response
from .errors import typed_errors
from .observe import TRACER_KEY, observed

MAX_BODY: Final = 4 * 1024 * 1024
"""Largest request body; the gateway refuses input text over 256 KiB anyway, the rest is room
for inline images and files (stored as blobs before the run request is published)."""

ROUTES: Final = (
    web.post("/v1/runs", runs.on_start_run),
    web.get("/v1/runs", runs.on_list_runs),
    web.get("/v1/runs/{run_id}", runs.on_get_run),
    web.get("/v1/runs/{run_id}/events", runs.on_run_events),
    web.post("/v1/runs/{run_id}/cancel", runs.on_cancel_run),
    web.post("/v1/runs/{run_id}/approvals/{call_id}", runs.on_decide),
    web.post("/v1/runs/{run_id}/pause", runs.on_pause_run),
    web.get("/v1/runs/{run_id}/pending", runs.on_run_pending),
    web.post("/v1/runs/{run_id}/edit", runs.on_edit_run),
    web.post("/v1/runs/{run_id}/resume", runs.on_resume_run),
    web.post("/v1/runs/{run_id}/fork", runs.on_fork_run),
    web.get("/v1/runs/{run_id}/agui", agui.on_watch_run),
    web.post("/v1/agui/{agent}", agui.on_run_agent),
    web.post("/v1/a2a/{agent}", a2a_routes.on_rpc),
    web.get("/v1/a2a/{agent}/.well-known/agent-card.json", a2a_routes.on_agent_card),
    web.post("/v1/mcp", mcp_endpoint.on_mcp),
    web.get("/v1/me", resources.on_me),
    web.get("/v1/agents", resources.on_list_agents),
    web.get("/v1/sessions", resources.on_list_sessions),
    web.get("/v1/sessions/{session_id}", resources.on_get_session),
    web.get("/v1/sessions/{session_id}/messages", resources.on_session_messages),
    web.get("/v1/memories", resources.on_list_memories),
    web.delete("/v1/memories/{memory_id}", resources.on_forget_memory),
    web.post("/v1/chat/completions", openai_chat.on_chat_completions),
    web.get("/v1/models", openai_chat.on_list_models),
    web.get("/v1/models/{model}", openai_chat.on_get_model),
    web.post("/v1/responses", responses.on_create_response),
    web.get("/openapi.json", openapi.on_openapi),
    web.get("/healthz", resources.on_healthz),
    web.get("/", console.on_index),
    web.get("/console/{asset}", console.on_asset),
)


def build_app(
    url: str | list[str],
    *,
    idle_timeout: float = 330.0,
    keepalive: float = 15.0,
    max_body: int = MAX_BODY,
    jaeger_url: str = "",
    connections: UserConnections | None = None,
    tracer_provider: TracerProvider | None = None,
) -> web.Application:
    """The ingress for the bus at `url`; each user's requests use a connection of their own.
    Its HTTP server spans go to `tracer_provider` (default: the process's)."""
    ingress = Ingress(
        connections=UserConnections(url) if connections is None else connections,
        idle_timeout=idle_timeout,
        keepalive=keepalive,
        jaeger_url=jaeger_url if "{trace_id}" in jaeger_url else jaeger_url.rstrip("/"),
    )
    # The span and the access log see the answer the error middleware made of a failure.
    app = web.Application(client_max_size=max_body, middlewares=[observed, typed_errors])
    app[INGRESS_KEY] = ingress
    app[TRACER_KEY] = trace.get_tracer("runbus.ingress", tracer_provider=tracer_provider)
    app.add_routes(ROUTES)

    async def connections_open(app: web.Application) -> AsyncIterator[None]:
        await ingress.connections.start()
        yield
        await ingress.connections.close()

    app.cleanup_ctx.append(connections_open)
    return app


__all__ = ["ROUTES", "build_app", "json_response"]
