"""The official `openai` SDK as the client of a runbus agent: completions whole and streamed,
usage, the tool activity extension, sessions, models, responses and OpenAI-shaped errors."""

from collections.abc import AsyncIterator
from typing import Any

import openai
import pydantic
import pytest
from openai import AsyncOpenAI

from runbus import ops, session_ids
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, RunCompleted


def runbus_of(model: pydantic.BaseModel) -> Any:
    """The `runbus` extension field of an SDK object (None when absent)."""
    return (model.model_extra or {}).get("runbus")


async def completed(client: RunbusClient, run_id: str) -> RunCompleted:
    """The run's final event, as the bus holds it."""
    final = None
    async for item in client.follow(run_id, timeout=10):
        final = item.event
    assert isinstance(final, RunCompleted)
    return final


@pytest.fixture
async def sdk(served: str) -> AsyncIterator[AsyncOpenAI]:
    # No retries: a refused request must surface at once, as the test expects it to.
    async with AsyncOpenAI(base_url=f"{served}/v1", api_key="dev-alice", max_retries=0) as c:
        yield c


async def test_a_completion_answers_with_the_runs_text_usage_and_tool_activity(
    sdk: AsyncOpenAI, alice: RunbusClient
) -> None:
    completion = await sdk.chat.completions.create(
        model="travel", messages=[{"role": "user", "content": "Weather in Sydney?"}]
    )
    extension = runbus_of(completion)
    run_id = completion.id.removeprefix("chatcmpl-")
    final = await completed(alice, run_id)

    assert extension["run_id"] == run_id
    assert completion.choices[0].message.content == final.text
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == final.usage.input_tokens
    assert completion.usage.completion_tokens == final.usage.output_tokens
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert [(t["name"], t["status"]) for t in extension["tool_calls"]] == [("get_weather", "done")]
    assert extension["tool_calls"][0]["result"]


async def test_a_streamed_completion_sends_the_text_as_deltas_then_usage(
    sdk: AsyncOpenAI, alice: RunbusClient
) -> None:
    stream = await sdk.chat.completions.create(
        model="travel",
        messages=[{"role": "user", "content": "Weather in Perth?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    final = await completed(alice, chunks[0].id.removeprefix("chatcmpl-"))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tools = [runbus_of(c)["tool_calls"][0] for c in chunks if runbus_of(c)]

    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == final.text
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens
    assert [(t["name"], t["status"]) for t in tools] == [
        ("get_weather", "called"),
        ("get_weather", "done"),
    ]


async def test_the_user_field_names_the_session_that_keeps_the_conversation(
    sdk: AsyncOpenAI, alice: RunbusClient
) -> None:
    first = "Weather in Hobart?"
    await sdk.chat.completions.create(
        model="travel", messages=[{"role": "user", "content": first}], user="oa-chat"
    )
    answer = await sdk.chat.completions.create(
        model="travel",
        messages=[
            {"role": "user", "content": first},
            {"role": "assistant", "content": "whatever the client kept"},
            {"role": "user", "content": "And in Darwin?"},
        ],
        user="oa-chat",
    )
    # The caller's own session of that `user`: nobody else's `user` names it.
    session_id = session_ids.scoped("acme", "alice", "oa-chat")
    loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))

    assert runbus_of(answer)["session_id"] == session_id
    # runbus kept the conversation: the turn the client replayed is not stored a second time.
    assert [m.text for m in loaded.messages if m.role == "user"] == [first, "And in Darwin?"]


async def test_models_are_the_callers_agents(sdk: AsyncOpenAI) -> None:
    models = [m.id async for m in sdk.models.list()]

    assert "travel" in models


async def test_a_response_continues_the_session_of_the_previous_one(sdk: AsyncOpenAI) -> None:
    first = await sdk.responses.create(model="travel", input="Weather in Sydney?")
    second = await sdk.responses.create(
        model="travel", input="Weather in Perth?", previous_response_id=first.id
    )

    assert first.output_text
    assert "Perth" in second.output_text
    assert runbus_of(second)["session_id"] == runbus_of(first)["session_id"]
    assert first.usage is not None
    assert first.usage.total_tokens > 0


async def test_errors_are_openai_errors_with_the_right_status_and_runbus_code(
    sdk: AsyncOpenAI, served: str
) -> None:
    stranger = AsyncOpenAI(base_url=f"{served}/v1", api_key="nope", max_retries=0)
    user = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.NotFoundError) as unknown:
        await sdk.chat.completions.create(model="nobody", messages=user)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError) as unknown_streamed:
        await sdk.chat.completions.create(model="nobody", messages=user, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as empty:
        await sdk.chat.completions.create(model="travel", messages=[])
    with pytest.raises(openai.BadRequestError) as no_user:
        await sdk.chat.completions.create(
            model="travel", messages=[{"role": "assistant", "content": "Hello"}]
        )
    with pytest.raises(openai.AuthenticationError) as refused:
        await stranger.models.list()
    with pytest.raises(openai.NotFoundError) as other_users:
        await sdk.responses.create(
            model="travel", input="Hi", previous_response_id="resp_r-not-yours"
        )
    await stranger.close()

    assert unknown.value.code == unknown_streamed.value.code == "unknown_agent"
    assert unknown.value.type == "not_found_error"
    assert (empty.value.code, empty.value.type) == ("bad_request", "invalid_request_error")
    assert no_user.value.code == "bad_request"
    assert (refused.value.code, refused.value.type) == ("unauthenticated", "authentication_error")
    assert other_users.value.code == "not_found"
