"""`$SRV.STATS` and `runbus status` tell what the handlers did: requests, errors and processing
time measured from a request's arrival to its reply, while requests are still handled
concurrently and a drain still awaits the ones in flight."""

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS

from runbus import discovery, ops
from runbus.errors import Unavailable
from runbus.headers import ERROR, RunContext
from runbus.messages.model import ModelRequest, ModelResponse
from runbus.service import API_GROUP, Endpoint, Service
from tests.helpers import eventually, take_time
from tests.integration.model_provider import Reply, ask, loopback, refusal, router
from tests.stack import SecuredNats, Stack

RUNBUS = str(Path(sys.executable).parent / "runbus")
SLOW: float = 0.3


class FailingModel(Service):
    """A model endpoint whose every call fails after `SLOW` seconds, or waits for `release`
    when the request asks for the model "held"."""

    name = "model_router"

    def __init__(self, nc: NATS) -> None:
        super().__init__(nc)
        self.release = asyncio.Event()
        self.held = 0

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint.for_op(ops.MODEL_COMPLETE, self.on_complete)]

    async def on_complete(self, ctx: RunContext, request: ModelRequest) -> ModelResponse:
        if request.route == "held":
            self.held += 1
            await self.release.wait()
            raise Unavailable("released")
        await take_time(SLOW)
        raise Unavailable("the provider answered 503")


@pytest.fixture
async def model(nc: NATS) -> AsyncIterator[FailingModel]:
    service = FailingModel(nc)
    await service.start()
    yield service
    service.release.set()
    await service.stop()


def request(model: str = "any") -> bytes:
    return msgspec.json.encode(ModelRequest(route=model, messages=[]))


async def status_json(nats_server: SecuredNats) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        RUNBUS,
        "status",
        "--json",
        env={
            **os.environ,
            "RUNBUS_DATA_DIR": str(nats_server.data_dir),
            "RUNBUS_NATS_URL": nats_server.client_url,
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert out, err.decode()
    status: dict[str, Any] = json.loads(out)
    return status


async def test_three_model_calls_failing_after_300ms_show_as_three_errors_averaging_300ms(
    nats_server: SecuredNats, nc: NATS
) -> None:
    routes = """
[backends.lb]
base_url = "{url}"
[routes.cheap]
[[routes.cheap.targets]]
backend = "lb"
model = "small-1"
"""
    async with loopback() as provider:
        provider.default = lambda: Reply(status=400, error="no such model", delay=SLOW)
        async with router(nats_server.url, routes.format(url=provider.base_url)):
            for _ in range(3):
                await refusal(nc, ask("hi"))

            status = await status_json(nats_server)

    (service,) = [s for s in status["services"] if s["name"] == "model_router"]
    (complete,) = [e for e in service["endpoints"] if e["name"] == ops.MODEL_COMPLETE.name]
    assert (complete["requests"], complete["answered"], complete["errors"]) == (3, 3, 3)
    assert complete["average_ms"] >= SLOW * 1000
    assert complete["last_error"] == "model_error: HTTP 400: no such model"


async def test_a_failing_handler_counts_as_an_error_with_its_code_and_reason(
    nc: NATS, model: FailingModel
) -> None:
    reply = await nc.request(ops.MODEL_COMPLETE.subject, request(), timeout=5)
    assert reply.headers is not None
    assert reply.headers.get(ERROR) == "unavailable"

    (router_seen,) = [i for i in await discovery.discover(nc, wait=0.3) if i.name == "model_router"]

    (complete,) = router_seen.endpoints
    assert (complete.requests, complete.errors) == (1, 1)
    assert complete.processing_ns >= SLOW * 1e9
    assert complete.last_error == "unavailable: the provider answered 503"


async def test_a_request_waiting_in_its_handler_does_not_hold_up_the_next_and_counts_as_received(
    nc: NATS, model: FailingModel
) -> None:
    held = asyncio.ensure_future(nc.request(ops.MODEL_COMPLETE.subject, request("held"), timeout=5))
    await eventually(lambda: model.held == 1)

    reply = await nc.request(ops.MODEL_COMPLETE.subject, request(), timeout=5)

    assert not held.done()
    assert reply.data
    (router,) = [i for i in await discovery.discover(nc, wait=0.3) if i.name == "model_router"]
    (complete,) = router.endpoints
    assert (complete.requests, complete.answered) == (2, 1)
    model.release.set()
    await held


async def test_stop_awaits_the_request_in_flight_and_counts_it(
    nc: NATS, model: FailingModel
) -> None:
    held = asyncio.ensure_future(nc.request(ops.MODEL_COMPLETE.subject, request("held"), timeout=5))
    await eventually(lambda: model.held == 1)

    stopping = asyncio.ensure_future(model.stop())
    await eventually(lambda: model._micro is None, what="stop() stopped listening")
    assert not stopping.done()
    model.release.set()
    await stopping

    reply = await held
    assert reply.headers is not None
    assert model._tallies[ops.MODEL_COMPLETE.subject].errors == 1


async def test_the_gateways_client_api_endpoints_form_one_group_on_unchanged_subjects(
    stack: Stack, nc: NATS
) -> None:
    found = await discovery.discover(nc, wait=0.5)

    (gateway,) = [i for i in found if i.name == "gateway"]
    grouped = {e.subject for e in gateway.endpoints if e.group == API_GROUP}
    assert grouped == {
        *(op.subject for op in ops.ALL if isinstance(op, ops.Op) and op.name.startswith("api-")),
        *(ops.api_op(op).subject for op in ops.FORWARDED),
    }
    assert all(e.group == "" for i in found if i.name != "gateway" for e in i.endpoints)


async def test_auth_is_listed_by_status_with_its_refused_connections_counted(
    nats_server: SecuredNats,
) -> None:
    refused = NATS()
    with pytest.raises(nats.errors.Error):
        await refused.connect(
            nats_server.client_url, token="not-a-token", allow_reconnect=False, connect_timeout=2
        )
    await refused.close()

    status = await status_json(nats_server)

    (auth,) = [s for s in status["services"] if s["name"] == "auth"]
    assert auth["ready"] == 1
    callout = {e["name"]: e for e in auth["endpoints"]}["callout"]
    assert (callout["requests"], callout["errors"]) == (1, 1)
