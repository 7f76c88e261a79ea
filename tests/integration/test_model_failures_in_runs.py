"""What a failing model does to a run: the router retries and fails over under its route
policy, the gateway does not re-run the run on top, history keeps the user's message and
nothing of the failed call, and the next run on the session sends the provider a valid prompt."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS

from runbus import ops
from runbus.client import RunbusClient, RunFailedError
from runbus.messages.runs import RunGet
from runbus_gateway.agents import AgentSpec
from runbus_model_router.config import parse_config
from tests.integration.model_provider import (
    LLAMACPP_CONTEXT_ERROR,
    LoopbackProvider,
    Reply,
    loopback,
    status_reply,
    text_reply,
)
from tests.stack import SecuredNats, Stack, start_stack

AGENT = AgentSpec(name="chat", model="flaky", instructions="Be brief.")


@pytest.fixture
async def provider() -> AsyncIterator[LoopbackProvider]:
    async with loopback() as running:
        yield running


@pytest.fixture
async def flaky_stack(
    nats_server: SecuredNats, tmp_path: Path, provider: LoopbackProvider
) -> AsyncIterator[Stack]:
    config = parse_config(
        f"""
[backends.lb]
base_url = "{provider.base_url}"
[routes.flaky]
[[routes.flaky.targets]]
backend = "lb"
model = "small-1"
retries = 1
backoff = 0
"""
    )
    async with start_stack(
        nats_server.url, data_dir=tmp_path / "data", agents={"chat": AGENT}, router_config=config
    ) as stack:
        yield stack


async def test_a_failing_model_fails_the_run_once_and_the_next_run_on_the_session_is_valid(
    flaky_stack: Stack, nc: NATS, provider: LoopbackProvider
) -> None:
    provider.script(status_reply(503), status_reply(503), text_reply("Hello again."))
    client = RunbusClient(nc, token="dev-alice")

    with pytest.raises(RunFailedError) as failed:
        await client.run("chat", "First question", session_id="s-flaky", run_id="r-fail")
    assert failed.value.remote_code == "model_unavailable"
    # The router's retry (retries = 1) and nothing more: the gateway did not re-run the run.
    assert len(provider.requests) == 2
    info = await client.call(ops.API_RUNS_GET, RunGet(run_id="r-fail"))
    assert (info.record.status, info.record.attempts) == ("failed", 1)

    completed = await client.run("chat", "Second question", session_id="s-flaky", run_id="r-ok")
    assert completed.text == "Hello again."
    prompt = provider.requests[-1]["messages"]
    # The failed run's input stays stored (audit, export) but no later prompt loads it.
    assert [(m["role"], m["content"]) for m in prompt] == [
        ("system", "Be brief."),
        ("user", "Second question"),
    ]


async def test_a_prompt_too_long_for_the_model_fails_the_run_saying_what_to_change(
    flaky_stack: Stack, nc: NATS, provider: LoopbackProvider
) -> None:
    provider.script(Reply(status=400, body=LLAMACPP_CONTEXT_ERROR))
    client = RunbusClient(nc, token="dev-alice")

    with pytest.raises(RunFailedError) as failed:
        await client.run("chat", "A very long question", session_id="s-long", run_id="r-long")

    assert failed.value.remote_code == "context_too_long"
    assert len(provider.requests) == 1, "neither the router nor the gateway tried again"
    info = await client.call(ops.API_RUNS_GET, RunGet(run_id="r-long"))
    assert info.record.error is not None
    shown = info.record.error.message
    assert shown.startswith("the prompt is too long for model 'small-1' (5012 tokens; it holds")
    assert all(remedy in shown for remedy in ("compaction", "last_turns", "larger context"))
