"""One bus connection per user: reused across that user's requests, never shared with another
user, closed when idle, bounded (a full ingress refuses with a typed 503 instead of queueing)."""

from runbus_ingress.connections import UserConnections
from tests.helpers import eventually
from tests.integration.ingress.conftest import ALICE, BOB, ingress
from tests.stack import SecuredNats, Stack

CAROL = {"Authorization": "Bearer dev-carol"}


async def test_each_user_gets_one_connection_of_their_own_reused_across_requests(
    stack: Stack, nats_server: SecuredNats
) -> None:
    connections = UserConnections(nats_server.url, idle_timeout=60)
    async with ingress(nats_server.url, connections=connections) as (_, http):
        statuses = []
        for headers in (ALICE, ALICE, BOB, ALICE, BOB):
            async with http.get("/v1/runs", headers=headers) as response:
                statuses.append(response.status)
        tokens = sorted(c.client.token for c in connections._open.values())

    assert statuses == [200] * 5
    assert connections.opened == 2
    assert tokens == ["dev-alice", "dev-bob"]


async def test_an_idle_connection_is_closed_and_reopened_on_the_next_request(
    stack: Stack, nats_server: SecuredNats
) -> None:
    connections = UserConnections(nats_server.url, idle_timeout=0.2)
    async with ingress(nats_server.url, connections=connections) as (_, http):
        async with http.get("/v1/agents", headers=ALICE) as response:
            first = response.status
        client = next(iter(connections._open.values())).client
        await eventually(lambda: len(connections) == 0, what="the idle connection closed")
        async with http.get("/v1/agents", headers=ALICE) as response:
            second = response.status

    assert (first, second) == (200, 200)
    assert client.nc.is_closed
    assert connections.opened == 2


async def test_a_full_ingress_refuses_with_503_and_makes_room_from_idle_users(
    stack: Stack, nats_server: SecuredNats
) -> None:
    connections = UserConnections(nats_server.url, max_connections=2, idle_timeout=60)
    async with ingress(nats_server.url, connections=connections) as (_, http):
        async with (
            connections.lease("dev-alice"),
            connections.lease("dev-bob"),
            http.get("/v1/agents", headers=CAROL) as response,
        ):
            busy = (response.status, (await response.json())["error"]["code"])
        # Both are idle now: carol's request closes the least recently used one, bob's (his
        # lease, the inner one, ended first).
        async with http.get("/v1/agents", headers=CAROL) as response:
            roomy = response.status
        open_tokens = sorted(c.client.token for c in connections._open.values())

    assert busy == (503, "unavailable")
    assert roomy == 200
    assert open_tokens == ["dev-alice", "dev-carol"]


async def test_a_token_the_bus_refuses_keeps_no_connection(
    stack: Stack, nats_server: SecuredNats
) -> None:
    connections = UserConnections(nats_server.url, idle_timeout=60)
    async with ingress(nats_server.url, connections=connections) as (_, http):
        async with http.get("/v1/agents", headers={"Authorization": "Bearer nope"}) as response:
            refused = (response.status, (await response.json())["error"]["code"])
        left_open = len(connections)

    assert refused == (401, "unauthenticated")
    assert left_open == 0
