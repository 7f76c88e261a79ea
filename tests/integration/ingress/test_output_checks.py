"""Structured output and output guardrails through the whole stack: the model asked natively,
the parsed output on `run.completed`, the OpenAI SDK's `response_format`, A2A's data part, and
a blocked answer that no event, SSE frame, history entry or log line holds a byte of."""

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import msgspec
import nats
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest
from google.protobuf import json_format
from nats.aio.client import Client as NATS
from openai import AsyncOpenAI, InternalServerError, UnprocessableEntityError
from structlog.testing import capture_logs

from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, ModelRequest, RunFailed, RunTextDelta
from runbus_gateway.agents import AgentSpec, load_agents
from tests.integration.ingress.conftest import ALICE, ingress
from tests.integration.ingress.test_runs_api import read_sse
from tests.models import GatedModel, text
from tests.stack import SecuredNats, start_stack

SECRET = "swordfish-7781"
TRIP: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
AGENTS = {
    "planner": '[output]\nname = "trip"\nschema_file = "trip.json"\n',
    "guarded": f'[output]\nguardrails = [{{name = "blocked_terms", terms = ["{SECRET}"]}}]\n',
    "plain": "",
}


def answers(request: ModelRequest, step: int) -> Any:
    asked = request.messages[-1].text
    if "secret" in asked:
        return text(f"Fine: the vault code is {SECRET}, keep it safe.")
    if request.response_format is not None:
        return text('{"city": "Kyoto", "days": 2}')
    return text("Kyoto is lovely in autumn.")


def agents_in(folder: Path) -> dict[str, AgentSpec]:
    folder.mkdir()
    (folder / "trip.json").write_text(json.dumps(TRIP))
    for name, body in AGENTS.items():
        (folder / f"{name}.toml").write_text(f'name = "{name}"\nmodel = "gated"\n{body}')
    return load_agents(folder)


class Served:
    def __init__(self, base: str, http: aiohttp.ClientSession, model: GatedModel, nc: NATS):
        self.base = base
        self.http = http
        self.model = model
        self.nc = nc
        self.alice = RunbusClient(nc, token="dev-alice")


@pytest.fixture
async def served(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Served]:
    model = GatedModel(answers)
    agents = agents_in(tmp_path / "agents")
    async with (
        start_stack(nats_server.url, data_dir=tmp_path, agents=agents, routes={"gated": model}),
        ingress(nats_server.client_url) as (base, http),
    ):
        nc = await nats.connect(nats_server.url)
        yield Served(base, http, model, nc)
        await nc.drain()


async def events_stream_bytes(nc: NATS) -> bytes:
    """Every message the events stream holds, concatenated."""
    js = nc.jetstream()
    state = (await js.stream_info(subjects.EVENTS_STREAM)).state
    found = [
        (await js.get_msg(subjects.EVENTS_STREAM, seq)).data or b""
        for seq in range(state.first_seq, state.last_seq + 1)
    ]
    return b"\n".join(found)


async def test_an_agents_output_schema_is_asked_natively_and_its_parsed_output_completes_the_run(
    served: Served,
) -> None:
    done = await served.alice.run("planner", "Plan Kyoto", session_id="p1")

    assert done.output == {"city": "Kyoto", "days": 2}
    assert json.loads(done.text) == done.output
    sent = served.model.requests[0]
    assert sent.response_format is not None
    assert sent.response_format.name == "trip"
    assert sent.response_format.schema == TRIP
    assert sent.stream_to is None  # held until checked


async def test_a_blocked_answer_leaves_no_byte_in_events_sse_or_history(served: Served) -> None:
    with capture_logs() as logs:
        run_id = await served.alice.start("guarded", "Tell me the secret", session_id="g1")
        followed = [item.event async for item in served.alice.follow(run_id, timeout=10)]
    async with served.http.get(f"/v1/runs/{run_id}/events", headers=ALICE) as response:
        frames = await read_sse(response)
    loaded = await served.alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="g1"))
    # Everything stored (the audit read): the failed run's input, and nothing of its answer.
    stored = await served.alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="g1", originals=True))

    assert isinstance(followed[-1], RunFailed)
    assert followed[-1].error.code == "output_blocked"
    assert served.model.requests[0].stream_to is None
    assert frames[-1].event == "run.failed"
    secret = SECRET.encode()
    assert secret not in await events_stream_bytes(served.nc)
    assert all(secret not in frame.data for frame in frames)
    assert any(line.get("code") == "output_blocked" for line in logs)
    assert SECRET not in repr(logs)
    assert secret not in msgspec.json.encode(stored)
    assert [m.text for m in stored.messages] == ["Tell me the secret"]
    assert loaded.messages == []  # a run that failed for good: no later prompt loads it


async def test_an_allowed_answer_of_a_guarded_agent_arrives_whole(served: Served) -> None:
    done = await served.alice.run("guarded", "Where to go?", session_id="g2")
    followed = [item.event async for item in served.alice.follow(done.run_id, timeout=10)]
    deltas = [e.delta for e in followed if isinstance(e, RunTextDelta)]

    assert done.text == "Kyoto is lovely in autumn."
    assert deltas == [done.text]


async def test_an_agent_without_output_checks_still_streams_from_the_model_router(
    served: Served,
) -> None:
    done = await served.alice.run("plain", "Where to go?", session_id="s1")

    assert done.output is None
    assert served.model.requests[0].stream_to == subjects.events("acme", "alice", done.run_id)
    assert served.model.requests[0].response_format is None


async def test_the_openai_sdk_gets_json_of_its_response_format_and_refusals_are_typed(
    served: Served,
) -> None:
    async with AsyncOpenAI(base_url=f"{served.base}/v1", api_key="dev-alice", max_retries=0) as sdk:
        completion = await sdk.chat.completions.create(
            model="plain",
            messages=[{"role": "user", "content": "Plan Kyoto"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "trip", "schema": TRIP, "strict": True},
            },
        )
        whole = await sdk.chat.completions.create(
            model="plain",
            messages=[{"role": "user", "content": "Plan Kyoto"}],
            response_format={"type": "json_object"},
        )
        with pytest.raises(UnprocessableEntityError) as blocked:
            await sdk.chat.completions.create(
                model="guarded", messages=[{"role": "user", "content": "the secret?"}]
            )
        narrow = {**TRIP, "properties": {**TRIP["properties"], "days": {"const": 5}}}
        with pytest.raises(InternalServerError) as invalid:
            await sdk.chat.completions.create(
                model="plain",
                messages=[{"role": "user", "content": "Plan Kyoto"}],
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "trip", "schema": narrow},
                },
            )

    assert json.loads(completion.choices[0].message.content or "") == {"city": "Kyoto", "days": 2}
    assert json.loads(whole.choices[0].message.content or "") == {"city": "Kyoto", "days": 2}
    assert served.model.requests[0].response_format is not None
    assert served.model.requests[0].response_format.schema == TRIP
    assert blocked.value.status_code == 422
    assert blocked.value.code == "output_blocked"
    assert SECRET not in blocked.value.message
    assert invalid.value.status_code == 502
    assert invalid.value.code == "output_invalid"
    # One repair turn, then the failure: two model calls for that run.
    assert len(served.model.requests) == 2 + 1 + 2


async def test_the_responses_api_honours_text_format(served: Served) -> None:
    async with AsyncOpenAI(base_url=f"{served.base}/v1", api_key="dev-alice", max_retries=0) as sdk:
        response = await sdk.responses.create(
            model="plain",
            input="Plan Kyoto",
            text={"format": {"type": "json_schema", "name": "trip", "schema": TRIP}},
        )

    assert json.loads(response.output_text) == {"city": "Kyoto", "days": 2}
    assert served.model.requests[0].response_format is not None
    assert served.model.requests[0].response_format.schema == TRIP


async def test_a_schema_that_is_no_json_schema_is_a_400(served: Served) -> None:
    body = {
        "model": "plain",
        "messages": [{"role": "user", "content": "Plan Kyoto"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "t", "schema": {"type": 7}},
        },
    }
    async with served.http.post("/v1/chat/completions", json=body, headers=ALICE) as response:
        status = response.status
        error = (await response.json())["error"]

    assert status == 400
    assert error["code"] == "bad_request"
    assert served.model.requests == []


async def test_a2a_returns_the_structured_output_as_a_data_part(served: Served) -> None:
    async with httpx.AsyncClient(headers=ALICE, timeout=30) as http:
        card = await A2ACardResolver(http, f"{served.base}/v1/a2a/planner").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        sent = Message(message_id="m-plan", role=Role.ROLE_USER, parts=[Part(text="Plan Kyoto")])
        responses = [r async for r in client.send_message(SendMessageRequest(message=sent))]
        read = await client.get_task(GetTaskRequest(id=responses[0].task.id))

    (artifact,) = responses[0].task.artifacts
    parts = [json_format.MessageToDict(p) for p in artifact.parts]
    assert json.loads(parts[0]["text"]) == {"city": "Kyoto", "days": 2}
    assert parts[1]["data"] == {"city": "Kyoto", "days": 2}
    (kept,) = read.artifacts
    assert json_format.MessageToDict(kept.parts[1])["data"] == {"city": "Kyoto", "days": 2}


def _data_parts(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, dict):
        if "data" in value and isinstance(value["data"], dict):
            found.append(value["data"])
        for inner in value.values():
            found += _data_parts(inner)
    elif isinstance(value, list):
        for inner in value:
            found += _data_parts(inner)
    return found
