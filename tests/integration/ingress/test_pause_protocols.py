"""A paused run as the protocols carry it: an A2A task is `input-required` (its status message
names the pending calls and how to edit and resume) until the run resumes and completes, and a
message sent to the paused task is a note the model reads as the run goes on; an AG-UI stream
has `runbus.paused` and `runbus.resumed` custom events around the edited call."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import httpx
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, SubscribeToTaskRequest, TaskState
from a2a.utils.errors import UnsupportedOperationError
from ag_ui import core as ag
from google.protobuf import json_format

from runbus.messages import ModelRequest
from tests.helpers import eventually
from tests.integration.ingress.conftest import ALICE, GATED_AGENTS, ingress
from tests.integration.ingress.test_a2a import answer_of, card_of, message, whole
from tests.integration.ingress.test_agui import read_agui
from tests.integration.test_pause_resume import weather_for
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, start_stack


def weather(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    results = [r for m in request.messages for r in m.function_results]
    if not results:
        return call("get_weather", "c-weather", city="Sydney")
    return text(f"Weather for {results[-1].result['city']}")


@contextlib.asynccontextmanager
async def held(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[tuple[str, GatedModel]]:
    """The stack (its model held at the first reply) and the ingress before it."""
    model = GatedModel(weather, hold={0})
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents=GATED_AGENTS, routes={"gated": model}
        ),
        ingress(nats_server.url) as (base, _),
    ):
        yield base, model


async def pause_when_held(http: httpx.AsyncClient, base: str, model: GatedModel) -> str:
    """Pause the one run the held model is writing for (its id from the runs list)."""
    await asyncio.wait_for(model.reached.wait(), 20)
    listed = (await http.get(f"{base}/v1/runs")).json()["records"]
    run_id: str = listed[0]["run_id"]
    assert (await http.post(f"{base}/v1/runs/{run_id}/pause")).status_code == 202
    model.release.set()
    return run_id


async def paused(http: httpx.AsyncClient, base: str, run_id: str) -> bool:
    return bool((await http.get(f"{base}/v1/runs/{run_id}")).json()["status"] == "paused")


async def test_a_paused_run_is_an_input_required_a2a_task_until_it_is_resumed(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    async with (
        held(nats_server, tmp_path) as (base, model),
        httpx.AsyncClient(headers=ALICE, timeout=30) as http,
    ):
        card = await card_of(base, ALICE)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        sending = asyncio.ensure_future(whole(client, message("Weather?")))
        run_id = await pause_when_held(http, base, model)
        task = await sending
        read = await client.get_task(GetTaskRequest(id=task.id))
        edit = {"replace": [{"call_id": "c-weather", "arguments": {"city": "Darwin"}}]}
        assert (await http.post(f"{base}/v1/runs/{run_id}/edit", json=edit)).status_code == 200
        assert (await http.post(f"{base}/v1/runs/{run_id}/resume")).status_code == 200
        streaming = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        updates = [u async for u in streaming.subscribe(SubscribeToTaskRequest(id=task.id))]
        done = await client.get_task(GetTaskRequest(id=task.id))

    assert task.id == run_id
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    said = task.status.message.parts[0].text
    assert f"/v1/runs/{run_id}/resume" in said
    paused = json_format.MessageToDict(task.status.message.parts[1].data)["paused"]
    assert [c["arguments"] for c in paused["calls"]] == [{"city": "Sydney"}]
    assert read.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert updates[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert (done.status.state, answer_of(done)) == (
        TaskState.TASK_STATE_COMPLETED,
        "Weather for Darwin",
    )


async def test_an_agui_stream_shows_the_pause_and_the_resume_around_the_edited_call(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    async with (
        held(nats_server, tmp_path) as (base, model),
        httpx.AsyncClient(headers=ALICE, timeout=30) as http,
        aiohttp.ClientSession(base, timeout=aiohttp.ClientTimeout(total=30)) as session,
    ):
        started = await http.post(
            f"{base}/v1/runs?detach=true", json={"agent": "travel", "text": "Weather?"}
        )
        run_id = started.json()["run_id"]
        await pause_when_held(http, base, model)
        async with session.get(f"/v1/runs/{run_id}/agui", headers=ALICE) as response:
            watching = asyncio.ensure_future(read_agui(response))
            edit = {"replace": [{"call_id": "c-weather", "arguments": {"city": "Cairns"}}]}
            # The stream replays the pause, whenever it is read; the resume follows it.
            await eventually(lambda: paused(http, base, run_id), what="the run paused")
            await http.post(f"{base}/v1/runs/{run_id}/edit", json=edit)
            await http.post(f"{base}/v1/runs/{run_id}/resume")
            events = await watching

    custom = [(e.name, e.value) for e in events if isinstance(e, ag.CustomEvent)]
    names = [name for name, _ in custom]
    assert names == ["runbus.paused", "runbus.resumed"]
    assert [c["arguments"] for c in custom[0][1]["calls"]] == [{"city": "Sydney"}]
    assert [c["arguments"] for c in custom[1][1]["calls"]] == [{"city": "Cairns"}]
    call_args = [e.delta for e in events if isinstance(e, ag.ToolCallArgsEvent)]
    assert call_args == ['{"city": "Cairns"}']
    assert isinstance(events[-1], ag.RunFinishedEvent)


async def test_a_message_to_a_paused_a2a_task_is_read_by_the_model_as_the_run_goes_on(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    model = GatedModel(weather_for, hold={0})
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents=GATED_AGENTS, routes={"gated": model}
        ),
        ingress(nats_server.url) as (base, _),
        httpx.AsyncClient(headers=ALICE, timeout=30) as http,
    ):
        card = await card_of(base, ALICE)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        sending = asyncio.ensure_future(whole(client, message("Weather?")))
        await pause_when_held(http, base, model)
        task = await sending
        answer = message("and is it windy?")
        answer.message.task_id = task.id
        answer.message.context_id = task.context_id
        done = await whole(client, answer)
        again = message("one more thing")
        again.message.task_id = task.id
        with pytest.raises(UnsupportedOperationError):
            await whole(client, again)

    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert done.id == task.id
    assert (done.status.state, answer_of(done)) == (
        TaskState.TASK_STATE_COMPLETED,
        "Weather for Sydney (and is it windy?)",
    )
