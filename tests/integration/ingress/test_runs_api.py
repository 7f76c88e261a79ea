"""The HTTP ingress over a real socket: an SSE client sees exactly what a bus client sees,
replays resume after any sequence, and auth, ownership, bad input and cancel answer as HTTP."""

import asyncio
import io
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import msgspec
import pytest
from structlog.testing import capture_logs

from runbus import subjects
from runbus.client import RunbusClient, SequencedEvent
from runbus.messages import RunCompleted
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus_ingress.sse import event_type
from tests.helpers import eventually
from tests.integration.ingress.conftest import ALICE, BOB, GATED_AGENTS, ingress, one_slot_taken
from tests.models import GatedModel, weather_then_answer
from tests.stack import SecuredNats, Stack, start_stack


class SseEvent(NamedTuple):
    id: int
    event: str
    data: bytes


async def read_sse(
    response: aiohttp.ClientResponse, comments: list[str] | None = None
) -> list[SseEvent]:
    """Every event of an SSE body until the server ends it; comments go to `comments`."""
    assert response.status == 200
    assert response.content_type == "text/event-stream"
    events: list[SseEvent] = []
    fields: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if fields:
                events.append(SseEvent(int(fields["id"]), fields["event"], fields["data"].encode()))
            fields = {}
        elif line.startswith(":"):
            (comments if comments is not None else []).append(line)
        else:
            name, _, value = line.partition(": ")
            fields[name] = value
    return events


def as_bus_sees_it(events: list[SseEvent]) -> list[tuple[int, str, object]]:
    return [(e.id, e.event, RUN_EVENT_DECODER.decode(e.data)) for e in events]


def bus_view(items: list[SequencedEvent]) -> list[tuple[int, str, object]]:
    return [(i.seq, event_type(i.event), i.event) for i in items]


async def error_of(response: aiohttp.ClientResponse) -> tuple[int, str]:
    body: dict[str, Any] = await response.json()
    return response.status, body["error"]["code"]


async def test_an_sse_client_sees_the_same_events_as_a_bus_client_byte_for_byte(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    # The bus client follows the run before the HTTP client starts it.
    bus = asyncio.create_task(_collect(alice.follow("r-same", timeout=20)))
    body = {"agent": "travel", "text": "Weather in Sydney?", "session_id": "h1", "run_id": "r-same"}
    async with http.post("/v1/runs", json=body, headers=ALICE) as response:
        run_header = response.headers["Runbus-Run-Id"]
        sse = await read_sse(response)
    seen_on_bus = await bus
    js = alice.nc.jetstream()
    stored = [(await js.get_msg(subjects.EVENTS_STREAM, e.id)).data for e in sse]

    assert run_header == "r-same"
    assert as_bus_sees_it(sse) == bus_view(seen_on_bus)
    assert [e.data for e in sse] == stored  # `data:` is the event's JSON exactly as stored
    types = [e.event for e in sse]
    assert types[0] == "run.started"
    assert types[-1] == "run.completed"
    assert {"run.tool_call", "run.tool_result", "run.text_delta"} <= set(types)


@pytest.mark.slow
async def test_replay_after_a_sequence_returns_exactly_the_later_events_then_ends(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    done = await alice.run("travel", "Weather in Perth?", session_id="h2", run_id="r-replay")
    bus = [i async for i in alice.follow(done.run_id)]
    after = bus[2].seq

    async with http.get(f"/v1/runs/r-replay/events?after={after}", headers=ALICE) as response:
        replayed = await read_sse(response)
    # What an EventSource sends when it reconnects; it wins over the query.
    resumed_at = {**ALICE, "Last-Event-ID": str(bus[-2].seq)}
    async with http.get("/v1/runs/r-replay/events?after=1", headers=resumed_at) as response:
        resumed = await read_sse(response)
    async with http.get(f"/v1/runs/r-replay/events?after={bus[-1].seq}", headers=ALICE) as done_r:
        nothing_left = done_r.status
    async with http.get("/v1/runs/r-replay/events", headers=ALICE) as response:
        everything = await read_sse(response)

    assert as_bus_sees_it(replayed) == bus_view(bus[3:])
    assert as_bus_sees_it(resumed) == bus_view(bus[-1:])
    assert replayed[-1].event == "run.completed"
    assert nothing_left == 204  # tells an EventSource to stop reconnecting
    assert as_bus_sees_it(everything) == bus_view(bus)


async def test_waiting_for_the_answer_returns_run_completed_as_json(
    http: aiohttp.ClientSession,
) -> None:
    body = {
        "agent": "travel",
        "input": [{"role": "user", "contents": [{"type": "text", "text": "Weather in Hobart?"}]}],
    }
    async with http.post("/v1/runs?wait=true", json=body, headers=ALICE) as response:
        completed = msgspec.json.decode(await response.read(), type=RunCompleted)
        run_id = response.headers["Runbus-Run-Id"]
    async with http.get(f"/v1/runs/{run_id}", headers=ALICE) as response:
        record = await response.json()
    async with http.get("/healthz") as response:
        health = response.status

    assert completed.run_id == run_id
    assert [m.role for m in completed.response] == ["assistant", "tool", "assistant"]
    assert record["status"] == "completed"
    assert record["user_id"] == "alice"
    assert record["text"] == completed.text
    assert health == 200


async def test_a_missing_or_unknown_bearer_token_is_401(http: aiohttp.ClientSession) -> None:
    body = {"agent": "travel", "text": "Hi"}
    answers = []
    for headers in ({}, {"Authorization": "Basic YWxpY2U6eA=="}, {"Authorization": "Bearer nope"}):
        async with http.post("/v1/runs", json=body, headers=headers) as response:
            answers.append((*await error_of(response), response.headers["WWW-Authenticate"]))
        async with http.get("/v1/runs/r-any", headers=headers) as response:
            answers.append((*await error_of(response), response.headers["WWW-Authenticate"]))

    assert answers == [(401, "unauthenticated", "Bearer")] * 6


async def test_bad_requests_are_refused_with_their_typed_code(
    http: aiohttp.ClientSession,
) -> None:
    post = [
        b"not json",
        b'{"text": "no agent"}',
        b'{"agent": "travel"}',
        b'{"agent": "travel", "text": "both", "input": []}',
        b'{"agent": "travel", "text": "Hi", "run_id": "has space"}',
        b'{"agent": "travel", "text": "Hi", "session_id": "a.b"}',
    ]
    answers = []
    for body in post:
        async with http.post("/v1/runs", data=body, headers=ALICE) as response:
            answers.append(await error_of(response))
    async with http.get("/v1/runs/r-x/events?after=-3", headers=ALICE) as response:
        answers.append(await error_of(response))
    async with http.get("/v1/runs/r-x/events?after=abc", headers=ALICE) as response:
        answers.append(await error_of(response))
    async with http.get("/v1/runs/r.x", headers=ALICE) as response:
        answers.append(await error_of(response))
    oversized = io.BytesIO(b"x" * (5 * 1024 * 1024))
    async with http.post("/v1/runs", data=oversized, headers=ALICE) as response:
        too_large = await error_of(response)
    async with http.post("/v1/runs", json={"agent": "nobody", "text": "Hi"}, headers=ALICE) as r:
        unknown_agent = (*await error_of(r), r.headers["Runbus-Run-Id"])

    assert answers == [(400, "bad_request")] * 9
    assert too_large == (413, "too_large")
    assert unknown_agent[:2] == (404, "unknown_agent")  # the run's own typed failure
    assert unknown_agent[2].startswith("r-")


async def test_another_users_run_is_not_found(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    await alice.run("travel", "Weather in Perth?", session_id="h3", run_id="r-alices")

    answers = []
    async with http.get("/v1/runs/r-alices", headers=BOB) as response:
        answers.append(await error_of(response))
    async with http.get("/v1/runs/r-alices/events", headers=BOB) as response:
        answers.append(await error_of(response))
    async with http.post("/v1/runs/r-alices/cancel", headers=BOB) as response:
        answers.append(await error_of(response))
    async with http.get("/v1/runs/r-alices", headers=ALICE) as response:
        owner = response.status

    assert answers == [(404, "not_found")] * 3
    assert owner == 200


async def test_a_run_started_through_the_sdk_shows_its_trace_id_to_its_owner_only(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    run_id, trace_id = await alice.start_traced("travel", "Weather in Perth?", session_id="h4")
    bus = await _collect(alice.follow(run_id, timeout=20))

    async with http.get(f"/v1/runs/{run_id}/events", headers=ALICE) as response:
        headers = response.headers
        events = await read_sse(response)
    async with http.get(f"/v1/runs/{run_id}/events?after={bus[1].seq}", headers=ALICE) as response:
        resumed_trace = response.headers.get("Runbus-Trace-Id")
        await read_sse(response)
    async with http.get(f"/v1/runs/{run_id}/events", headers=BOB) as response:
        refused = (*await error_of(response), response.headers.get("Runbus-Trace-Id"))
    async with http.get(f"/v1/runs/{run_id}", headers=ALICE) as response:
        record = (response.headers.get("Runbus-Trace-Id"), (await response.json())["trace_id"])

    assert headers["Runbus-Run-Id"] == run_id
    assert headers["Runbus-Trace-Id"] == trace_id
    assert resumed_trace == trace_id
    assert as_bus_sees_it(events) == bus_view(bus)
    assert refused == (404, "not_found", None)
    assert record == (trace_id, trace_id)


async def test_cancel_ends_a_running_run_and_its_stream(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer, hold={0})
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents=GATED_AGENTS, routes={"gated": model}
        ),
        ingress(nats_server.url, keepalive=0.1) as (_, http),
    ):
        body = {"agent": "travel", "text": "Weather?", "run_id": "r-cancel"}
        comments: list[str] = []
        async with http.post("/v1/runs", json=body, headers=ALICE) as response:
            stream = asyncio.create_task(read_sse(response, comments))
            await asyncio.wait_for(model.reached.wait(), 20)
            # The run is idle while its model call waits: the stream still shows life.
            await eventually(lambda: len(comments) >= 2)
            async with http.post("/v1/runs/r-cancel/cancel", headers=ALICE) as cancel:
                cancel_status = cancel.status
                before = await cancel.json()
            events = await asyncio.wait_for(stream, 20)
        model.release.set()
        async with http.get("/v1/runs/r-cancel", headers=ALICE) as response:
            record = await response.json()

    assert cancel_status == 202
    assert before["status"] == "running"
    assert [e.event for e in events] == ["run.started", "run.failed"]
    assert msgspec.json.decode(events[-1].data)["error"]["code"] == "cancelled"
    assert record["status"] == "cancelled"
    assert len(comments) >= 2  # an idle stream still shows life to proxies
    assert set(comments) == {": keepalive"}


async def test_a_queued_run_gets_its_stream_at_once_and_its_events_when_it_starts(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    async with (
        one_slot_taken(nats_server, tmp_path, alice) as model,
        ingress(nats_server.url, keepalive=0.1) as (_, http),
    ):
        body = {"agent": "travel", "text": "Weather?", "session_id": "queued"}
        async with http.post("/v1/runs", json=body, headers=ALICE) as response:
            status = response.status
            opening = await response.content.readuntil(b"\n\n")
            model.release.set()
            events = await read_sse(response)

    assert status == 200
    assert opening == b": keepalive\n\n"
    assert [events[0].event, events[-1].event] == ["run.started", "run.completed"]


async def test_a_client_that_hangs_up_mid_run_does_not_stop_the_run_and_can_resume_live(
    nats_server: SecuredNats, tmp_path: Path, alice: RunbusClient
) -> None:
    model = GatedModel(weather_then_answer, hold={1})
    async with (
        start_stack(
            nats_server.url, data_dir=tmp_path, agents=GATED_AGENTS, routes={"gated": model}
        ),
        ingress(nats_server.url) as (_, http),
    ):
        body = {"agent": "travel", "text": "Weather?", "run_id": "r-gone"}
        with capture_logs() as logs:
            async with http.post("/v1/runs", json=body, headers=ALICE) as response:
                first = await response.content.readuntil(b"\n\n")
                await asyncio.wait_for(model.reached.wait(), 20)
                response.close()  # the client hangs up while the run waits on its model
            # Its handler ends (and stops following the run) without waiting for an event.
            await eventually(lambda: any(e["event"] == "http_stream_closed" for e in logs))
        seen_id = first.split(b"\n")[0].removeprefix(b"id: ").decode()
        resume = {**ALICE, "Last-Event-ID": seen_id}
        async with http.get("/v1/runs/r-gone/events", headers=resume) as response:
            model.release.set()  # the run goes on while the client follows it again
            resumed = await read_sse(response)
        bus = [i async for i in alice.follow("r-gone", timeout=20)]
        async with http.get("/v1/runs/r-gone", headers=ALICE) as response:
            record = await response.json()

    assert b"event: run.started" in first
    assert as_bus_sees_it(resumed) == bus_view(bus[1:])  # every event after the one it saw
    assert resumed[-1].event == "run.completed"
    assert record["status"] == "completed"


async def _collect(items: AsyncIterator[SequencedEvent]) -> list[SequencedEvent]:
    return [item async for item in items]


@pytest.mark.subprocess
async def test_runbus_http_serves_runs_as_its_own_process(
    stack: Stack, nats_server: SecuredNats, tmp_path: Path
) -> None:
    env = {**os.environ, "RUNBUS_NATS_URL": nats_server.url, "RUNBUS_DATA_DIR": str(tmp_path)}
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "runbus"),
        "http",
        "--port",
        "0",
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        base = await asyncio.wait_for(_listening_url(process.stderr), 30)
        body = {"agent": "travel", "text": "Weather in Sydney?"}
        async with (
            aiohttp.ClientSession(base) as http,
            http.get("/healthz") as health,
            http.post("/v1/runs", json=body, headers=ALICE) as response,
        ):
            health_status = health.status
            events = await read_sse(response)
    finally:
        process.terminate()
        code = await asyncio.wait_for(process.wait(), 30)

    assert health_status == 200
    assert [events[0].event, events[-1].event] == ["run.started", "run.completed"]
    assert code == 0


async def _listening_url(stderr: asyncio.StreamReader) -> str:
    while line := await stderr.readline():
        entry = json.loads(line)
        if entry["event"] == "http_listening":
            return str(entry["url"])
    raise AssertionError("the ingress exited before it listened")
