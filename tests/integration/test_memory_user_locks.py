"""One user's model-policy writes are reconciled one at a time across memory replicas
(locks.py): a per-user key in a KV bucket, taken only where there is none, released on every
path out, and expiring when its holder died holding it; and a memory replica whose user's lock
another replica holds calls no model for that user until it is released."""

import asyncio
import json
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import nats
import pytest
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from runbus import ops, subjects
from runbus.headers import RunContext
from runbus.messages import ChatMessage, MemoryStore, ModelResponse, TextContent, encode
from runbus_memory.locks import UserLocks, lock_key
from runbus_memory.qdrant import QdrantClientStore
from tests.helpers import eventually
from tests.integration.test_memory_service import Deployment, Memory
from tests.stack import SecuredNats


@pytest.fixture
async def replicas(nats_server: SecuredNats) -> AsyncIterator[tuple[UserLocks, UserLocks]]:
    """The locks of two replicas, each on its own connection."""
    first, second = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    try:
        yield await UserLocks.open(first), await UserLocks.open(second)
    finally:
        await first.drain()
        await second.drain()


def waiting(logs: list[MutableMapping[str, Any]]) -> bool:
    return any(entry["event"] == "memory_user_lock_waiting" for entry in logs)


async def test_a_users_lock_held_by_one_replica_is_waited_for_by_another(
    replicas: tuple[UserLocks, UserLocks],
) -> None:
    a, b = replicas
    order: list[str] = []

    async def second() -> None:
        async with b.hold("acme", "alice"):
            order.append("b")

    with structlog.testing.capture_logs() as logs:
        async with a.hold("acme", "alice"):
            waiter = asyncio.create_task(second())
            await eventually(lambda: waiting(logs), what="b waiting for alice's lock")
            order.append("a")
        await asyncio.wait_for(waiter, 10)

    assert order == ["a", "b"]


async def test_another_users_lock_is_not_held_up(replicas: tuple[UserLocks, UserLocks]) -> None:
    a, b = replicas

    async with a.hold("acme", "alice"):
        async with asyncio.timeout(5):
            async with b.hold("acme", "bob"), b.hold("globex", "alice"):
                pass


async def test_a_lock_is_released_when_its_holder_fails(
    replicas: tuple[UserLocks, UserLocks],
) -> None:
    a, b = replicas

    with pytest.raises(RuntimeError):
        async with a.hold("acme", "alice"):
            raise RuntimeError("the model call failed")

    async with asyncio.timeout(5):
        async with b.hold("acme", "alice"):
            pass


async def test_the_lock_of_a_replica_that_died_holding_it_expires(nc: NATS) -> None:
    locks = await UserLocks.open(nc, ttl=1.0)
    await locks.kv.create(lock_key("acme", "alice"), b"a replica that died")  # never released

    async with asyncio.timeout(10):
        async with locks.hold("acme", "alice"):
            pass


# -- through two memory replicas ---------------------------------------------------------------


ALICE = RunContext(
    run_id="r-veg",
    session_id="s1",
    agent="concierge",
    props={
        "tenant": "acme",
        "user_id": "alice",
        "memory_store": "model",
        "memory_store_route": "cheap",
    },
)


async def test_a_replica_calls_no_model_for_a_user_whose_lock_another_replica_holds(
    nats_server: SecuredNats, nc: NATS, tmp_path: Path
) -> None:
    asked: list[str] = []

    async def model(msg: Msg) -> None:
        request = ops.MODEL_COMPLETE.decode.decode(msg.data)
        asked.append(request.route)
        answer = {"facts": [{"text": "I'm vegetarian.", "action": "add", "replaces": []}]}
        reply = ModelResponse(
            message=ChatMessage(role="assistant", contents=[TextContent(text=json.dumps(answer))]),
            model="scripted",
            finish_reason="stop",
        )
        await msg.respond(encode(reply))

    await nc.subscribe(subjects.MODEL_COMPLETE, cb=model)
    deployment = Deployment(nats_server.url, tmp_path)
    # One store for both, as a Qdrant server is for the replicas of a deployment.
    store = await QdrantClientStore.open(384, location=":memory:", embedder="hashing")
    try:
        await deployment.start(store=store)
        await deployment.start(store=store)
        other = await UserLocks.open(nc)  # what a third replica reconciling alice holds
        with structlog.testing.capture_logs() as logs:
            async with other.hold("acme", "alice"):
                await nc.jetstream().publish(
                    subjects.MEMORY_WRITES,
                    encode(MemoryStore(texts=["Note: I'm vegetarian."])),
                    headers=ALICE.to_headers(),
                )
                await eventually(lambda: waiting(logs), what="a replica waiting for alice")
                assert asked == []
            memory: Memory = await deployment.client()
            await memory.settled()

        assert asked == ["cheap"]
        assert await memory.listed(ALICE) == ["I'm vegetarian."]
    finally:
        await deployment.close()
