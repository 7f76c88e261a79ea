"""The caller's agents, sessions with their transcripts, and memories: the same client-API
operations the CLI makes, each answered for the caller alone (another user's ids are 404)."""

from aiohttp import web

from runbus.errors import NotFound
from runbus.messages import HistoryLoad, encode
from runbus.messages.history import HISTORY_LOADED_DECODER
from runbus.messages.memory import (
    MEMORY_FORGOTTEN_DECODER,
    MEMORY_LISTED_DECODER,
    MemoryForget,
    MemoryList,
)
from runbus.messages.runs import AGENT_LISTED_DECODER, AgentList
from runbus.messages.sessions import (
    SESSION_INFO_DECODER,
    SESSION_LISTED_DECODER,
    SessionGet,
    SessionList,
)

from .context import checked_identifier, identifier, ingress_of, int_query, json_response


async def on_list_agents(request: web.Request) -> web.Response:
    async with ingress_of(request).client(request) as client:
        listed = await client.call("agents.list", AgentList(), AGENT_LISTED_DECODER)
    return json_response(encode(listed))


async def on_list_sessions(request: web.Request) -> web.Response:
    limit = int_query(request, "limit", 100, low=1, high=1000)
    async with ingress_of(request).client(request) as client:
        listed = await client.call(
            "sessions.list", SessionList(limit=limit), SESSION_LISTED_DECODER
        )
    return json_response(encode(listed))


async def on_get_session(request: web.Request) -> web.Response:
    session_id = identifier(request, "session_id")
    async with ingress_of(request).client(request) as client:
        info = await client.call(
            "sessions.get", SessionGet(session_id=session_id), SESSION_INFO_DECODER
        )
    return json_response(encode(info.record))


async def on_session_messages(request: web.Request) -> web.Response:
    """The transcript. History answers an unknown session with no messages, so the session is
    read first: another user's session is `not_found`, not an empty transcript."""
    session_id = identifier(request, "session_id")
    async with ingress_of(request).client(request) as client:
        await client.call("sessions.get", SessionGet(session_id=session_id), SESSION_INFO_DECODER)
        loaded = await client.call(
            "history.load", HistoryLoad(session_id=session_id), HISTORY_LOADED_DECODER
        )
    return json_response(encode(loaded))


async def on_list_memories(request: web.Request) -> web.Response:
    session_id = request.query.get("session_id")
    if session_id is not None:
        checked_identifier(session_id, "session_id")
    limit = int_query(request, "limit", 100, low=1, high=1000)
    cursor = request.query.get("cursor")
    if cursor is not None:
        checked_identifier(cursor, "cursor")
    query = MemoryList(session_id=session_id, limit=limit, cursor=cursor)
    async with ingress_of(request).client(request) as client:
        listed = await client.call("memory.list", query, MEMORY_LISTED_DECODER)
    return json_response(encode(listed))


async def on_forget_memory(request: web.Request) -> web.Response:
    memory_id = identifier(request, "memory_id")
    async with ingress_of(request).client(request) as client:
        forgotten = await client.call(
            "memory.forget", MemoryForget(memory_ids=[memory_id]), MEMORY_FORGOTTEN_DECODER
        )
    if not forgotten.forgotten:
        # The memory service forgets nothing of another user's: the same answer as no memory.
        raise NotFound(f"no memory {memory_id!r}")
    return json_response(encode(forgotten))


async def on_healthz(request: web.Request) -> web.Response:
    """Alive, and how many users' bus connections are open."""
    connections = ingress_of(request).connections
    return json_response({"status": "ok", "connections": len(connections)})
