"""A runbus agent behind A2A, driven by the `a2a-sdk` package's own client and decoded with its
own types: the agent card, a message run to its answer whole and streamed, the context as the
session, tasks read back, owner-bound tasks and contexts, and JSON-RPC errors by code."""

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import msgspec
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.compat.v0_3 import types as v03
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError
from google.protobuf import json_format
from google.protobuf.struct_pb2 import Value

from runbus import ops, session_ids
from runbus.client import RunbusClient
from runbus.messages import (
    HistoryLoad,
    ModelRequest,
    ModelResponse,
    RunCompleted,
    TextContent,
    Usage,
)
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_model_router.backends import OnDelta
from tests.helpers import eventually
from tests.integration.ingress.conftest import ALICE, BOB, ingress
from tests.models import call, text, turn_step
from tests.stack import SecuredNats, start_stack

AGENT = "/v1/a2a/travel"


def message(text: str, *, context_id: str = "", part: Part | None = None) -> SendMessageRequest:
    sent = Message(
        message_id=f"m-{uuid.uuid4().hex[:12]}",
        role=Role.ROLE_USER,
        parts=[part or Part(text=text)],
        context_id=context_id,
    )
    return SendMessageRequest(message=sent)


async def card_of(served: str, headers: dict[str, str]) -> AgentCard:
    async with httpx.AsyncClient(headers=headers) as http:
        resolver = A2ACardResolver(http, f"{served}{AGENT}")
        return await resolver.get_agent_card()


@pytest.fixture
async def a2a_client(served: str) -> AsyncIterator[tuple[Client, Client]]:
    """Alice's and Bob's SDK clients for the travel agent, streaming off (one answer each)."""
    async with (
        httpx.AsyncClient(headers=ALICE, timeout=30) as alice_http,
        httpx.AsyncClient(headers=BOB, timeout=30) as bob_http,
    ):
        card = await card_of(served, ALICE)
        clients = tuple(
            ClientFactory(ClientConfig(httpx_client=h, streaming=False)).create(card)
            for h in (alice_http, bob_http)
        )
        yield clients[0], clients[1]


async def whole(client: Client, request: SendMessageRequest) -> Task:
    responses = [r async for r in client.send_message(request)]
    assert len(responses) == 1
    assert responses[0].HasField("task")
    return responses[0].task


async def completed(client: RunbusClient, run_id: str) -> RunCompleted:
    final = None
    async for item in client.follow(run_id, timeout=10):
        final = item.event
    assert isinstance(final, RunCompleted)
    return final


async def user_texts(client: RunbusClient, context_id: str) -> list[str]:
    """What the user said in the session of their A2A context, as its owner's history holds
    it (the context is scoped to its caller: `runbus.session_ids`)."""
    me = await client.identity()
    session_id = session_ids.scoped(me.tenant, me.user_id, context_id)
    loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
    return [
        c.text
        for m in loaded.messages
        if m.role == "user"
        for c in m.contents
        if isinstance(c, TextContent)
    ]


def answer_of(task: Task) -> str:
    (artifact,) = task.artifacts
    assert artifact.artifact_id == "answer"
    return "".join(p.text for p in artifact.parts)


async def test_the_agent_card_names_the_agents_endpoint_streaming_and_bearer_auth(
    served: str, http: aiohttp.ClientSession
) -> None:
    card = await card_of(served, ALICE)
    async with http.get(f"{AGENT}/.well-known/agent-card.json") as anonymous:
        anonymous_status = anonymous.status
    async with http.get("/v1/a2a/nobody/.well-known/agent-card.json", headers=ALICE) as unknown:
        unknown_status = unknown.status

    assert card.name == "travel"
    assert card.capabilities.streaming
    assert {(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces} == {
        (f"{served}{AGENT}", "JSONRPC", "1.0"),
        (f"{served}{AGENT}", "JSONRPC", "0.3"),
    }
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert anonymous_status == 401
    assert unknown_status == 404


async def test_a_message_runs_the_agent_and_the_task_holds_its_answer(
    a2a_client: tuple[Client, Client], alice: RunbusClient
) -> None:
    client, _ = a2a_client
    task = await whole(client, message("What's the weather in Sydney?", context_id="a2a-s1"))
    final = await completed(alice, task.id)
    read = await client.get_task(GetTaskRequest(id=task.id))

    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.context_id == "a2a-s1"
    assert answer_of(task) == final.text
    assert "Sydney" in final.text
    assert [m.parts[0].text for m in task.history] == ["What's the weather in Sydney?"]
    assert read.status.state == TaskState.TASK_STATE_COMPLETED
    assert (read.id, read.context_id, answer_of(read)) == (task.id, "a2a-s1", final.text)


async def test_the_context_id_is_the_session_a_second_message_continues(
    a2a_client: tuple[Client, Client], alice: RunbusClient
) -> None:
    client, _ = a2a_client
    first = await whole(client, message("Weather in Sydney?"))
    second = await whole(client, message("And in Tokyo?", context_id=first.context_id))
    said = await user_texts(alice, first.context_id)

    assert first.context_id.startswith("s-")
    assert second.context_id == first.context_id
    assert second.id != first.id
    assert said == ["Weather in Sydney?", "And in Tokyo?"]


async def test_a_streamed_message_sends_the_task_its_updates_and_the_answer(
    served: str, alice: RunbusClient
) -> None:
    async with httpx.AsyncClient(headers=ALICE, timeout=30) as http:
        card = await card_of(served, ALICE)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        responses: list[StreamResponse] = [
            r async for r in client.send_message(message("Weather in Sydney?"))
        ]
    kinds = [r.WhichOneof("payload") for r in responses]
    task = responses[0].task
    final = await completed(alice, task.id)
    states = [r.status_update.status.state for r in responses if r.HasField("status_update")]
    tool_parts = [
        json_format.MessageToDict(r.status_update.status.message.parts[0].data)
        for r in responses
        if r.HasField("status_update") and r.status_update.status.message.parts
    ]
    chunks = [r.artifact_update for r in responses if r.HasField("artifact_update")]

    assert kinds[0] == "task"
    assert task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert states[0] == TaskState.TASK_STATE_WORKING
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    assert kinds[-1] == "status_update"
    assert [next(iter(p)) for p in tool_parts] == ["tool_call", "tool_result"]
    assert tool_parts[0]["tool_call"]["name"] == "get_weather"
    assert tool_parts[0]["tool_call"]["arguments"] == {"city": "Sydney"}
    # Deltas stream into the answer; the last chunk replaces it with the run's final text.
    assert "".join(p.text for c in chunks[:-1] for p in c.artifact.parts) == final.text
    assert (chunks[-1].append, chunks[-1].last_chunk) == (False, True)
    assert chunks[-1].artifact.parts[0].text == final.text
    assert all(r.status_update.task_id == task.id for r in responses if r.HasField("status_update"))


async def test_another_user_cannot_read_a_task_nor_reach_a_run_through_its_context(
    a2a_client: tuple[Client, Client], alice: RunbusClient
) -> None:
    alice_client, bob_client = a2a_client
    task = await whole(alice_client, message("Weather in Sydney?", context_id="a2a-private"))
    with pytest.raises(TaskNotFoundError):
        await bob_client.get_task(GetTaskRequest(id=task.id))
    # The same contextId is his own context: it neither reaches hers nor is refused.
    intruder = await whole(bob_client, message("What did I ask?", context_id="a2a-private"))
    again = await whole(alice_client, message("And in Tokyo?", context_id="a2a-private"))
    said = await user_texts(alice, "a2a-private")

    assert intruder.status.state == TaskState.TASK_STATE_COMPLETED
    assert intruder.context_id == "a2a-private"
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert said == ["Weather in Sydney?", "And in Tokyo?"]


async def rpc(
    http: aiohttp.ClientSession, body: object, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(AGENT, data=data, headers={**ALICE, **(headers or {})}) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
    return answer


async def test_bad_calls_are_json_rpc_errors_with_a2as_codes(
    http: aiohttp.ClientSession,
) -> None:
    def call(method: str, params: object) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}

    file_part = json_format.MessageToDict(
        message("", part=Part(url="https://example.invalid/a.png", media_type="image/png"))
    )
    codes = {
        "not json": (await rpc(http, b"{nope"))["error"]["code"],
        "no method": (await rpc(http, {"jsonrpc": "2.0", "id": 1}))["error"]["code"],
        "unknown method": (await rpc(http, call("tasks/explode", {})))["error"]["code"],
        "bad params": (await rpc(http, call("GetTask", {"id": 5, "historyLength": "x"})))["error"][
            "code"
        ],
        "no task": (await rpc(http, call("GetTask", {"id": "r-nothing-here"})))["error"]["code"],
        "not text": (await rpc(http, call("SendMessage", file_part)))["error"]["code"],
        "bad version": (
            await rpc(http, call("GetTask", {"id": "r-x"}), headers={"A2A-Version": "9.1"})
        )["error"]["code"],
        "push": (await rpc(http, call("tasks/pushNotificationConfig/get", {"id": "r-x"})))["error"][
            "code"
        ],
    }
    async with http.post(AGENT, data=json.dumps(call("GetTask", {"id": "r-x"}))) as anonymous:
        anonymous_status = anonymous.status

    assert codes == {
        "not json": -32700,
        "no method": -32600,
        "unknown method": -32601,
        "bad params": -32602,
        "no task": -32001,
        "not text": -32005,
        "bad version": -32009,
        "push": -32003,
    }
    assert anonymous_status == 401


async def test_an_a2a_0_3_client_uses_message_send_and_tasks_get(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    request = v03.SendMessageRequest(
        id="1",
        params=v03.MessageSendParams(
            message=v03.Message(
                message_id="m-03",
                role=v03.Role.user,
                parts=[v03.Part(root=v03.TextPart(text="Weather in Sydney?"))],
            )
        ),
    )
    sent = await rpc(http, request.model_dump(mode="json", by_alias=True, exclude_none=True))
    task = v03.Task.model_validate(sent["result"])
    final = await completed(alice, task.id)
    got = await rpc(
        http,
        v03.GetTaskRequest(id="2", params=v03.TaskQueryParams(id=task.id)).model_dump(
            mode="json", by_alias=True, exclude_none=True
        ),
    )
    read = v03.Task.model_validate(got["result"])

    assert task.status.state == v03.TaskState.completed
    assert task.artifacts is not None
    assert task.artifacts[0].parts[0].root.text == final.text  # type: ignore[union-attr]
    assert read.status.state == v03.TaskState.completed


class BookingModel:
    """Books business class (over the approval limit), then says it is booked."""

    name = "booking"

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        if turn_step(request) == 0:
            message = call("create_booking", "c-book", flight_id="QF412-20261208", cabin="business")
        else:
            await on_delta("Booked.")
            message = text("Booked.")
        return ModelResponse(
            message=message,
            model="booking",
            finish_reason="tool_calls" if message.function_calls else "stop",
            usage=Usage(input_tokens=10, output_tokens=3),
        )


@pytest.fixture
async def booking_base(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[str]:
    """The ingress before a stack whose travel agent books business class (needs approval)."""
    model = BookingModel()
    agents = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="booking")}
    async with (
        start_stack(nats_server.url, data_dir=tmp_path, agents=agents, routes={"booking": model}),
        ingress(nats_server.url) as (base, _),
    ):
        yield base


async def test_a_call_waiting_for_approval_returns_the_task_input_required_until_decided(
    booking_base: str,
) -> None:
    async with (
        httpx.AsyncClient(headers=ALICE, timeout=30) as http,
        httpx.AsyncClient(headers=BOB, timeout=30) as bob_http,
    ):
        card = await card_of(booking_base, ALICE)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        bob = ClientFactory(ClientConfig(httpx_client=bob_http, streaming=False)).create(card)
        task = await whole(client, message("Book QF412 in business, please"))
        waiting = json_format.MessageToDict(task.status.message.parts[1].data)
        call_id = waiting["approval_requested"]["call_id"]
        with pytest.raises(TaskNotFoundError):
            await bob.cancel_task(CancelTaskRequest(id=task.id))
        # Follow the task from here, then decide: the updates run on to its end.
        streaming = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
        updates = streaming.subscribe(SubscribeToTaskRequest(id=task.id))
        snapshot = await anext(updates)
        decided = await http.post(
            f"{booking_base}/v1/runs/{task.id}/approvals/{call_id}", json={"decision": "approved"}
        )
        rest = [r async for r in updates]
        done = await client.get_task(GetTaskRequest(id=task.id))
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(CancelTaskRequest(id=task.id))

    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert f"/v1/runs/{task.id}/approvals/{call_id}" in task.status.message.parts[0].text
    assert snapshot.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert decided.status_code == 200
    assert rest[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert (done.status.state, answer_of(done)) == (TaskState.TASK_STATE_COMPLETED, "Booked.")


async def test_cancelling_a_waiting_task_cancels_its_run(booking_base: str) -> None:
    async with httpx.AsyncClient(headers=ALICE, timeout=30) as http:
        card = await card_of(booking_base, ALICE)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        task = await whole(client, message("Book QF412 in business, please"))
        await client.cancel_task(CancelTaskRequest(id=task.id))

        async def cancelled() -> bool:
            read = await client.get_task(GetTaskRequest(id=task.id))
            return read.status.state == TaskState.TASK_STATE_CANCELED

        await eventually(cancelled, what="the task is cancelled")


async def test_an_a2a_0_3_client_streams_with_message_stream(
    http: aiohttp.ClientSession, alice: RunbusClient
) -> None:
    request = v03.SendStreamingMessageRequest(
        id="s1",
        params=v03.MessageSendParams(
            message=v03.Message(
                message_id="m-03-stream",
                role=v03.Role.user,
                parts=[v03.Part(root=v03.TextPart(text="Weather in Sydney?"))],
            )
        ),
    )
    body = request.model_dump(mode="json", by_alias=True, exclude_none=True)
    frames: list[v03.SendStreamingMessageSuccessResponse] = []
    async with http.post(AGENT, json=body, headers=ALICE) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async for raw in response.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data: "):
                frames.append(v03.SendStreamingMessageSuccessResponse.model_validate_json(line[6:]))
    task = frames[0].result
    assert isinstance(task, v03.Task)
    final = await completed(alice, task.id)
    last = frames[-1].result

    assert {f.id for f in frames} == {"s1"}
    assert isinstance(last, v03.TaskStatusUpdateEvent)
    assert last.status.state == v03.TaskState.completed
    assert last.final
    answers = [
        f.result.artifact
        for f in frames
        if isinstance(f.result, v03.TaskArtifactUpdateEvent) and f.result.last_chunk
    ]
    assert answers[-1].parts[0].root.text == final.text  # type: ignore[union-attr]


async def test_a_message_to_a_task_waiting_for_approval_is_its_owners_decision(
    booking_base: str,
) -> None:
    async with (
        httpx.AsyncClient(headers=ALICE, timeout=30) as http,
        httpx.AsyncClient(headers=BOB, timeout=30) as bob_http,
    ):
        card = await card_of(booking_base, ALICE)
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        bob = ClientFactory(ClientConfig(httpx_client=bob_http, streaming=False)).create(card)
        task = await whole(client, message("Book QF412 in business, please"))
        follow_up = message("Yes, business is fine.")
        follow_up.message.task_id = task.id
        follow_up.message.context_id = task.context_id
        with pytest.raises(TaskNotFoundError):
            await whole(bob, follow_up)  # another user's answer reaches no task
        done = await whole(client, follow_up)
        again = await whole(client, message("Book QF412 in business, please"))
        denial = message("", part=Part(data=json_format.ParseDict({"decision": "denied"}, Value())))
        denial.message.task_id = again.id
        denied = await whole(client, denial)
        refused = await http.get(f"{booking_base}/v1/runs/{again.id}/events")

    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert done.id == task.id
    assert (done.status.state, answer_of(done)) == (TaskState.TASK_STATE_COMPLETED, "Booked.")
    assert denied.status.state == TaskState.TASK_STATE_COMPLETED
    [result] = [
        line
        for line in refused.text.splitlines()
        if line.startswith("data: ") and '"run.tool_result"' in line
    ]
    assert "alice denied approval" in result
