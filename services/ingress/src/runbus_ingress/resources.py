"""Who the caller is, and the caller's agents, sessions with their transcripts, and memories:
the same client-API operations the CLI makes, each answered for the caller alone (another
user's ids are 404)."""

import msgspec
from aiohttp import web

from runbus import ops
from runbus.errors import NotFound
from runbus.messages import HistoryLoad, encode
from runbus.messages.memory import (
    MemoryForget,
    MemoryList,
)
from runbus.messages.runs import AgentList
from runbus.messages.sessions import (
    SessionGet,
    SessionList,
)

from .context import identifier, identifier_query, ingress_of, int_query, json_response


class Me(msgspec.Struct, frozen=True):
    """Answer of `GET /v1/me`: the owner the caller's token stands for."""

    user_id: str
    tenant: str


async def on_me(request: web.Request) -> web.Response:
    async with ingress_of(request).client(request) as client:
        identity = await client.identity()
    return json_response(Me(user_id=identity.user_id, tenant=identity.tenant))


async def on_list_agents(request: web.Request) -> web.Response:
    async with ingress_of(request).client(request) as client:
        listed = await client.call(ops.API_AGENTS_LIST, AgentList())
    return json_response(encode(listed))


async def on_list_sessions(request: web.Request) -> web.Response:
    limit = int_query(request, "limit", 100, low=1, high=1000)
    async with ingress_of(request).client(request) as client:
        listed = await client.call(ops.SESSIONS_LIST, SessionList(limit=limit))
    return json_response(encode(listed))


async def on_get_session(request: web.Request) -> web.Response:
    session_id = identifier(request, "session_id")
    async with ingress_of(request).client(request) as client:
        info = await client.call(ops.SESSIONS_GET, SessionGet(session_id=session_id))
    return json_response(encode(info.record))


async def on_session_messages(request: web.Request) -> web.Response:
    """The transcript. History answers an unknown session with no messages, so the session is
    read first: another user's session is `not_found`, not an empty transcript."""
    session_id = identifier(request, "session_id")
    async with ingress_of(request).client(request) as client:
        await client.call(ops.SESSIONS_GET, SessionGet(session_id=session_id))
        loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
    return json_response(encode(loaded))


async def on_list_memories(request: web.Request) -> web.Response:
    session_id = identifier_query(request, "session_id")
    limit = int_query(request, "limit", 100, low=1, high=1000)
    cursor = identifier_query(request, "cursor")
    query = MemoryList(session_id=session_id, limit=limit, cursor=cursor)
    async with ingress_of(request).client(request) as client:
        listed = await client.call(ops.MEMORY_LIST, query)
    return json_response(encode(listed))


async def on_forget_memory(request: web.Request) -> web.Response:
    memory_id = identifier(request, "memory_id")
    async with ingress_of(request).client(request) as client:
        forgotten = await client.call(ops.MEMORY_FORGET, MemoryForget(memory_ids=[memory_id]))
    if not forgotten.forgotten:
        # The memory service forgets nothing of another user's: the same answer as no memory.
        raise NotFound(f"no memory {memory_id!r}")
    return json_response(encode(forgotten))


async def on_healthz(request: web.Request) -> web.Response:
    """Alive, and how many users' bus connections are open."""
    connections = ingress_of(request).connections
    return json_response({"status": "ok", "connections": len(connections)})
