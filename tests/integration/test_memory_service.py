"""The memory service over a real nats-server: scopes from trusted headers only, writes through
the JetStream stream (at-least-once, deduplicated), the `memory_search` tool with its scope
forced, list / forget / stats, and bad input refused with the collection unchanged."""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS

from runbus import ops, subjects
from runbus.errors import remote_error
from runbus.headers import RunContext
from runbus.messages import ToolInvoke, encode
from runbus.messages.memory import (
    MemoryForget,
    MemoryList,
    MemorySearch,
    MemoryStatistics,
    MemoryStats,
    MemoryStore,
)
from runbus.ops import Op
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.remote import OpenAIEmbedder
from runbus_memory.service import MemoryService
from tests.helpers import eventually
from tests.stack import SecuredNats

from .memory_embeddings import embeddings_provider

Rep = TypeVar("Rep", bound=msgspec.Struct)

WINDOW_SEAT = "I always want a window seat"


def who(
    user_id: str = "alice",
    tenant: str = "acme",
    session_id: str = "s1",
    *,
    agent: str = "travel",
    **props: str,
) -> RunContext:
    """The headers the gateway sets for a run of `user_id` in `tenant`."""
    return RunContext(
        run_id=f"r-{user_id}-{session_id}",
        session_id=session_id,
        agent=agent,
        props={"tenant": tenant, "user_id": user_id, **props},
    )


ALICE = who()
ALICE_S2 = who(session_id="s2")
BOB = who("bob")
CAROL = who("carol", "globex")
ALICE_GLOBEX = who("alice", "globex")
ALICE_WEB = who(application_id="web")


class Failed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Memory:
    """A client of the memory service's subjects, sending the headers a gateway would."""

    def __init__(self, nc: NATS) -> None:
        self.nc = nc

    async def call(
        self, op: Op[Any, Rep], body: msgspec.Struct | bytes, ctx: RunContext = ALICE
    ) -> Rep:
        data = body if isinstance(body, bytes) else encode(body)
        reply = await self.nc.request(
            op.subject, data, headers=ctx.to_headers() or None, timeout=10
        )
        if (error := remote_error(reply.headers, reply.data)) is not None:
            raise Failed(error.remote_code, error.message)
        return op.decode_reply.decode(reply.data)

    async def store(self, ctx: RunContext, *texts: str) -> list[str]:
        stored = await self.call(
            ops.MEMORY_STORE,
            MemoryStore(texts=list(texts)),
            ctx,
        )
        return stored.memory_ids

    async def search(self, ctx: RunContext, query: str = WINDOW_SEAT, **options: Any) -> list[str]:
        request = MemorySearch(query=query, limit=20, **options)
        hits = await self.call(ops.MEMORY_SEARCH, request, ctx)
        return [hit.text for hit in hits.hits]

    async def stats(self, ctx: RunContext = ALICE) -> MemoryStatistics:
        return await self.call(ops.MEMORY_STATS, MemoryStats(), ctx)

    async def listed(self, ctx: RunContext = ALICE) -> list[str]:
        listed = await self.call(ops.MEMORY_LIST, MemoryList(), ctx)
        return sorted(m.text for m in listed.memories)

    async def forget(self, ctx: RunContext, **what: Any) -> int:
        forgotten = await self.call(ops.MEMORY_FORGET, MemoryForget(**what), ctx)
        return forgotten.forgotten

    async def tool(self, ctx: RunContext, arguments: dict[str, Any]) -> Any:
        invoked = await self.call(
            ops.TOOL_INVOKE.at("memory_search"),
            ToolInvoke(call_id="c1", name="memory_search", arguments=arguments),
            ctx,
        )
        return invoked.result

    async def write(self, ctx: RunContext, *texts: str, **fields: Any) -> None:
        """What the gateway does at the end of a run: publish to the writes stream."""
        await self.nc.jetstream().publish(
            subjects.MEMORY_WRITES,
            encode(MemoryStore(texts=list(texts), **fields)),
            headers=ctx.to_headers(),
        )

    async def settled(self, timeout: float = 10.0) -> None:
        """Until no write is waiting in the stream or unacknowledged."""
        js = self.nc.jetstream()

        async def drained() -> bool:
            info = await js.consumer_info(
                subjects.MEMORY_WRITES_STREAM, subjects.MEMORY_WRITES_CONSUMER
            )
            return not info.num_pending and not info.num_ack_pending

        await eventually(drained, timeout)


class Deployment:
    """Memory replicas, each on its own connection, and clients connected after them (a
    client connected before a subscription sometimes gets `no responders` from the server
    for its first request)."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url = url
        self.data_dir = data_dir
        self.replicas: list[tuple[MemoryService, NATS]] = []
        self.clients: list[NATS] = []

    async def start(self, **options: Any) -> MemoryService:
        nc = await nats.connect(self.url)
        options.setdefault("embedder", HashingEmbedder())
        options.setdefault("data_dir", self.data_dir)
        options.setdefault("write_ack_wait", 1.0)
        service = MemoryService(nc, **options)
        try:
            await service.start()
        except BaseException:
            await nc.close()
            raise
        await nc.flush()  # the server has its subscriptions before anyone calls
        self.replicas.append((service, nc))
        return service

    async def stop(self, service: MemoryService) -> None:
        for index, (started, nc) in enumerate(self.replicas):
            if started is service:
                del self.replicas[index]
                await service.stop()
                await nc.drain()
                return

    async def client(self) -> Memory:
        nc = await nats.connect(self.url)
        self.clients.append(nc)
        return Memory(nc)

    async def close(self) -> None:
        for nc in self.clients:
            await nc.drain()
        for service, nc in reversed(self.replicas):
            if nc.is_closed:  # a replica a test "crashed": release what it holds
                await service.on_stop()
            else:
                await service.stop()
                await nc.drain()


@pytest.fixture
async def deployment(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Deployment]:
    made = Deployment(nats_server.url, tmp_path / "qdrant")
    yield made
    await made.close()


@pytest.fixture
async def memory(deployment: Deployment) -> Memory:
    await deployment.start()
    return await deployment.client()


# -- scopes ----------------------------------------------------------------------------------


async def test_a_fact_stored_in_one_session_is_found_from_another_session_of_the_user(
    memory: Memory,
) -> None:
    await memory.store(ALICE, WINDOW_SEAT)

    assert await memory.search(ALICE_S2, "book me a window seat") == [WINDOW_SEAT]


@pytest.mark.parametrize(
    "other", [BOB, CAROL, ALICE_GLOBEX, ALICE_WEB], ids=["bob", "carol", "alice@globex", "web"]
)
@pytest.mark.parametrize("scope", ["tenant", "user", "session", "agent"])
async def test_nobody_outside_the_owners_scope_finds_the_memory(
    memory: Memory, other: RunContext, scope: str
) -> None:
    await memory.store(ALICE, WINDOW_SEAT)

    if other is BOB and scope == "tenant":
        assert await memory.search(other, scope=scope) == [WINDOW_SEAT]  # a shared tenant scope
    else:
        assert await memory.search(other, scope=scope) == []


async def test_scope_fields_named_in_the_request_narrow_the_search(memory: Memory) -> None:
    await memory.store(ALICE, "a window seat on the travel agent")
    await memory.store(who(agent="chef"), "a window seat in the kitchen")

    assert await memory.search(ALICE_S2, "window seat", match=["user_id", "agent_id"]) == [
        "a window seat on the travel agent"
    ]


async def test_a_search_with_an_empty_scope_finds_nothing(memory: Memory) -> None:
    await memory.store(ALICE, WINDOW_SEAT)

    assert await memory.search(ALICE, match=[]) == []


async def test_a_search_naming_an_unknown_scope_field_is_refused(memory: Memory) -> None:
    await memory.store(ALICE, WINDOW_SEAT)

    with pytest.raises(Failed) as raised:
        await memory.search(ALICE, match=["user_id", "organisation"])

    assert raised.value.code == "unknown_scope_field"


async def test_the_score_threshold_leaves_weak_hits_out(memory: Memory) -> None:
    await memory.store(ALICE, WINDOW_SEAT, "my dog is called Rex")

    assert await memory.search(ALICE, WINDOW_SEAT, min_score=0.5) == [WINDOW_SEAT]


async def test_a_fact_stored_from_several_sessions_is_recalled_once(memory: Memory) -> None:
    await memory.store(ALICE, WINDOW_SEAT)
    await memory.store(ALICE_S2, WINDOW_SEAT + ".")

    assert len(await memory.search(ALICE)) == 1
    assert len(await memory.listed()) == 2


async def test_requests_without_the_trusted_identity_are_refused(memory: Memory) -> None:
    anonymous = RunContext(session_id="s1", agent="travel")

    requests: list[tuple[Op[Any, Any], msgspec.Struct]] = [
        (ops.MEMORY_STORE, MemoryStore(texts=[WINDOW_SEAT])),
        (ops.MEMORY_SEARCH, MemorySearch(query="seat")),
        (ops.MEMORY_FORGET, MemoryForget(everything=True)),
    ]
    for op, body in requests:
        with pytest.raises(Failed) as raised:
            await memory.call(op, body, anonymous)
        assert raised.value.code == "unauthenticated"


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"type": "memory.store", "texts": [""]}, "bad_request"),
        ({"type": "memory.store", "texts": ["fine", "   "]}, "bad_request"),
        ({"type": "memory.store", "texts": ["x" * 1_000_000]}, "bad_request"),
        ({"type": "memory.store", "texts": ["fine"] * 65}, "bad_request"),
        (
            {
                "type": "memory.store",
                "texts": ["fine", "recalled"],
                "sources": ["external", "context_provider"],
            },
            "not_storable",
        ),
        (
            {"type": "memory.store", "texts": ["a memory"], "sources": ["chat_history"]},
            "not_storable",
        ),
        ({"type": "memory.store", "texts": "not a list"}, "bad_request"),
    ],
    ids=["empty", "blank", "1MB", "too-many", "context_provider", "chat_history", "not-a-list"],
)
async def test_bad_store_input_is_a_typed_error_and_stores_nothing(
    memory: Memory, body: dict[str, Any], code: str
) -> None:
    await memory.store(ALICE, WINDOW_SEAT)

    with pytest.raises(Failed) as raised:
        await memory.call(ops.MEMORY_STORE, json.dumps(body).encode(), ALICE)

    assert raised.value.code == code
    assert await memory.listed() == [WINDOW_SEAT]


async def test_vectors_of_the_wrong_size_from_a_misconfigured_embedder_store_nothing(
    deployment: Deployment,
) -> None:
    async with embeddings_provider() as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, "loopback-embed")
        await deployment.start(embedder=embedder)
        memory = await deployment.client()
        await memory.store(ALICE, WINDOW_SEAT)
        provider.dimension = 256  # the endpoint was switched to another model

        with pytest.raises(Failed) as raised:
            await memory.store(ALICE, "my dog is called Rex")

        assert raised.value.code == "vector_size_mismatch"
        provider.dimension = 384
        assert await memory.listed() == [WINDOW_SEAT]


async def test_a_memory_service_with_another_embedder_than_its_shard_embeds_its_memories_again(
    deployment: Deployment,
) -> None:
    async with embeddings_provider() as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, "loopback-embed")
        first = await deployment.start(embedder=embedder)
        await (await deployment.client()).store(ALICE, WINDOW_SEAT)
        await deployment.stop(first)

    await deployment.start(embedder=HashingEmbedder(256))
    memory = await deployment.client()

    assert await memory.search(ALICE) == [WINDOW_SEAT]
    assert (await memory.stats()).dimension == 256


# -- writes off the run's path ---------------------------------------------------------------


async def test_a_write_on_the_stream_is_found_by_the_next_search(memory: Memory) -> None:
    await memory.write(ALICE, WINDOW_SEAT)
    await memory.settled()  # acknowledged only once stored

    assert await memory.search(ALICE_S2, "window seat") == [WINDOW_SEAT]


async def test_the_same_fact_written_five_times_is_stored_once(memory: Memory) -> None:
    for variant in (
        WINDOW_SEAT,
        WINDOW_SEAT + ".",
        WINDOW_SEAT.upper(),
        f"  {WINDOW_SEAT}!",
        WINDOW_SEAT,
    ):
        await memory.write(ALICE, variant)
    await memory.settled()

    assert (await memory.stats()).memories == 1


async def test_a_write_that_can_never_be_stored_is_dropped_not_retried(memory: Memory) -> None:
    await memory.write(ALICE, "what you remember: window seat", sources=["context_provider"])
    await memory.write(RunContext(session_id="s1"), "no identity")
    await memory.write(ALICE, WINDOW_SEAT)
    await memory.settled()

    assert await memory.listed() == [WINDOW_SEAT]


async def test_a_write_published_while_the_memory_service_is_down_is_stored_when_it_starts(
    deployment: Deployment,
) -> None:
    first = await deployment.start()  # creates the stream and its consumer
    await deployment.stop(first)
    memory = await deployment.client()

    await memory.write(ALICE, WINDOW_SEAT)  # acknowledged: the stream holds it
    await deployment.start()
    await memory.settled()

    assert await memory.search(ALICE_S2) == [WINDOW_SEAT]


async def test_a_write_whose_replica_died_before_storing_it_is_stored_by_another_replica(
    deployment: Deployment, tmp_path: Path
) -> None:
    async with embeddings_provider() as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, "loopback-embed")
        provider.hold = asyncio.Event()  # from now on the provider answers nothing
        provider.received.clear()
        doomed = await deployment.start(embedder=embedder, data_dir=tmp_path / "doomed")
        memory = await deployment.client()

        await memory.write(ALICE, WINDOW_SEAT)
        await asyncio.wait_for(provider.received.wait(), 10)  # delivered, embedding, not stored
        await doomed.nc.close()  # the replica dies: no ack will ever come
        await deployment.start(data_dir=tmp_path / "survivor")
        await memory.settled()

        assert await memory.search(ALICE_S2) == [WINDOW_SEAT]


# -- the memory_search tool ------------------------------------------------------------------


async def test_memory_search_tool_returns_only_the_callers_memories_whatever_the_model_asks(
    memory: Memory,
) -> None:
    await memory.store(ALICE, WINDOW_SEAT)
    await memory.store(BOB, "bob always wants an aisle seat")
    await memory.store(CAROL, "carol always wants a window seat")

    result = await memory.tool(
        ALICE_S2,
        {"query": "window seat", "user_id": "bob", "tenant": "globex", "scope": "tenant"},
    )

    assert result.error is None
    assert [m["text"] for m in result.result["memories"]] == [WINDOW_SEAT]


async def test_memory_search_tool_scope_and_top_k_come_from_trusted_properties(
    memory: Memory,
) -> None:
    await memory.store(ALICE, "a window seat, said in the first session")
    await memory.store(ALICE_S2, "a window seat, said in the second session")
    await memory.store(ALICE_S2, "a window seat near the front, second session")

    narrowed = who(session_id="s2", memory_scope="session", memory_limit="1")
    result = await memory.tool(narrowed, {"query": "window seat second session"})

    assert [m["text"] for m in result.result["memories"]] == [
        "a window seat, said in the second session"
    ]


async def test_memory_search_tool_without_a_query_answers_the_model_with_an_error(
    memory: Memory,
) -> None:
    result = await memory.tool(ALICE, {"scope": "tenant"})

    assert result.result is None
    assert "query" in (result.error or "")


# -- list, find, forget, stats ---------------------------------------------------------------


async def test_listing_pages_through_the_callers_memories(memory: Memory) -> None:
    await memory.store(ALICE, *(f"fact {n}" for n in range(5)))
    await memory.store(BOB, "bob's fact")

    first = await memory.call(ops.MEMORY_LIST, MemoryList(limit=3), ALICE_S2)
    second = await memory.call(
        ops.MEMORY_LIST,
        MemoryList(limit=3, cursor=first.next_cursor),
        ALICE_S2,
    )

    assert second.next_cursor is None
    assert sorted(m.text for m in first.memories + second.memories) == [
        f"fact {n}" for n in range(5)
    ]
    assert {m.session_id for m in first.memories} == {"s1"}


async def test_a_cursor_the_service_never_gave_out_is_refused(memory: Memory) -> None:
    with pytest.raises(Failed) as raised:
        await memory.call(
            ops.MEMORY_LIST,
            MemoryList(cursor="../../etc"),
            ALICE,
        )

    assert raised.value.code == "bad_request"


async def test_find_searches_the_callers_own_memories_only(memory: Memory) -> None:
    await memory.store(ALICE, WINDOW_SEAT)
    await memory.store(BOB, "bob wants a window seat too")

    found = await memory.call(
        ops.MEMORY_FIND,
        MemorySearch(query="window seat"),
        ALICE_S2,
    )
    with pytest.raises(Failed) as raised:
        await memory.call(
            ops.MEMORY_FIND,
            MemorySearch(query="window seat", scope="tenant"),
            ALICE,
        )

    assert [hit.text for hit in found.hits] == [WINDOW_SEAT]
    assert raised.value.code == "bad_request"


async def test_forgetting_a_user_removes_every_memory_of_that_user_and_nothing_else(
    memory: Memory,
) -> None:
    await memory.store(ALICE, "one", "two")
    await memory.store(ALICE_S2, "three")
    await memory.store(ALICE_WEB, "four")
    await memory.store(BOB, "bob's")
    await memory.store(ALICE_GLOBEX, "the other alice's")

    forgotten = await memory.forget(ALICE_S2, everything=True)

    assert forgotten == 4
    assert await memory.listed(ALICE) == []
    assert await memory.search(ALICE_WEB, "four") == []
    assert await memory.listed(BOB) == ["bob's"]
    assert await memory.listed(ALICE_GLOBEX) == ["the other alice's"]


async def test_forgetting_by_id_removes_only_the_callers_memory(memory: Memory) -> None:
    (mine, kept) = await memory.store(ALICE, WINDOW_SEAT, "my dog is called Rex")
    (bobs,) = await memory.store(BOB, WINDOW_SEAT)

    assert await memory.forget(ALICE, memory_ids=[bobs, "not-an-id"]) == 0
    assert await memory.forget(ALICE, memory_ids=[mine]) == 1

    assert await memory.listed(ALICE) == ["my dog is called Rex"]
    assert await memory.listed(BOB) == [WINDOW_SEAT]
    assert kept != mine


async def test_forgetting_a_session_keeps_the_users_other_sessions(memory: Memory) -> None:
    await memory.store(ALICE, "from the first session")
    await memory.store(ALICE_S2, "from the second session")

    assert await memory.forget(ALICE_S2, session_id="s1") == 1
    assert await memory.listed() == ["from the second session"]


async def test_forget_without_saying_what_is_refused(memory: Memory) -> None:
    await memory.store(ALICE, WINDOW_SEAT)

    with pytest.raises(Failed) as raised:
        await memory.forget(ALICE)

    assert raised.value.code == "bad_request"
    assert await memory.listed() == [WINDOW_SEAT]


async def test_stats_count_the_callers_memories_and_name_the_embedder_and_store(
    memory: Memory,
) -> None:
    await memory.store(ALICE, "one", "two")
    await memory.store(BOB, "three")

    stats = await memory.stats(ALICE_S2)

    assert stats == MemoryStatistics(
        memories=2, embedder="hashing", dimension=384, store="edge", pending_writes=0
    )
