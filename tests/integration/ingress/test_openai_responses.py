"""OpenAI's Responses API as its own clients use it: the `openai` SDK's `responses.stream()`
and LangChain's `ChatOpenAI(use_responses_api=True)` streaming, and `models.retrieve`."""

from collections.abc import AsyncIterator

import openai
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import SecretStr

from runbus.client import RunbusClient
from runbus.messages import RunCompleted


async def completed(client: RunbusClient, run_id: str) -> RunCompleted:
    final = None
    async for item in client.follow(run_id, timeout=10):
        final = item.event
    assert isinstance(final, RunCompleted)
    return final


@pytest.fixture
async def sdk(served: str) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{served}/v1", api_key="dev-alice", max_retries=0) as c:
        yield c


async def test_a_streamed_response_sends_the_responses_event_sequence_and_the_final_response(
    sdk: AsyncOpenAI, alice: RunbusClient
) -> None:
    async with sdk.responses.stream(model="travel", input="Weather in Sydney?") as stream:
        kinds = [event.type async for event in stream]
        response = await stream.get_final_response()
    final = await completed(alice, response.id.removeprefix("resp_"))

    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert response.status == "completed"
    assert final.text in response.output_text
    assert response.usage is not None
    assert response.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


async def test_a_streamed_response_continues_the_previous_responses_session(
    sdk: AsyncOpenAI,
) -> None:
    first = await sdk.responses.create(model="travel", input="Weather in Sydney?")
    async with sdk.responses.stream(
        model="travel", input="Weather in Perth?", previous_response_id=first.id
    ) as stream:
        second = await stream.get_final_response()

    assert "Perth" in second.output_text
    assert (second.model_extra or {})["runbus"]["session_id"] == (first.model_extra or {})[
        "runbus"
    ]["session_id"]


async def test_a_refused_streamed_response_is_an_openai_error(sdk: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        await sdk.responses.create(model="nobody", input="Hi", stream=True)

    assert unknown.value.code == "unknown_agent"


async def test_langchain_streams_an_agent_through_the_responses_api(
    served: str, alice: RunbusClient
) -> None:
    chat = ChatOpenAI(
        model="travel",
        base_url=f"{served}/v1",
        api_key=SecretStr("dev-alice"),
        use_responses_api=True,
        max_retries=0,
    )
    chunks = [chunk async for chunk in chat.astream("Weather in Hobart?")]
    whole = sum(chunks[1:], chunks[0])
    assert isinstance(whole, AIMessageChunk)
    response_id = whole.response_metadata["id"]
    final = await completed(alice, response_id.removeprefix("resp_"))

    assert len([c for c in chunks if c.text]) >= 1
    assert final.text in whole.text
    assert whole.response_metadata["status"] == "completed"


async def test_a_model_is_retrieved_by_its_agent_name(sdk: AsyncOpenAI) -> None:
    model = await sdk.models.retrieve("travel")
    with pytest.raises(openai.NotFoundError) as unknown:
        await sdk.models.retrieve("nobody")

    assert (model.id, model.object) == ("travel", "model")
    assert unknown.value.code == "unknown_agent"


async def test_a_response_request_with_the_clients_own_tools_is_refused_not_dropped(
    sdk: AsyncOpenAI,
) -> None:
    tool = {
        "type": "function",
        "name": "lookup_order",
        "description": "Look an order up",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
    }

    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.responses.create(model="travel", input="Where is order 7?", tools=[tool])  # type: ignore[list-item]

    assert refused.value.status_code == 400
    assert "/v1/chat/completions" in refused.value.message
