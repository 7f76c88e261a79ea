"""A prompt longer than a real model server's context: llama.cpp (the `xllamacpp` wheel serving
SmolLM2-135M-Instruct, one slot of 512 tokens) refuses it, and the caller gets
`context_too_long` with both sizes and what to change, not a generic model error."""

from collections.abc import Iterator

import pytest
from nats.aio.client import Client as NATS

from runbus.local_model import LocalModelServer, router_toml
from tests.integration.model_provider import ask, refusal, router
from tests.stack import SecuredNats

pytestmark = [pytest.mark.timeout(120), pytest.mark.real_model]

CONTEXT = 512


@pytest.fixture(scope="module")
def small_llama() -> Iterator[LocalModelServer]:
    with LocalModelServer(slots=1, threads=1, context=CONTEXT) as server:
        yield server


async def test_a_prompt_longer_than_the_servers_context_is_refused_as_too_long(
    nats_server: SecuredNats, nc: NATS, small_llama: LocalModelServer
) -> None:
    routes = router_toml(small_llama.base_url, target="retries = 2")
    async with router(nats_server.url, routes):
        error = await refusal(nc, ask("tell me about dragons " * 300, route="local"))

    assert error.code == "context_too_long"
    assert error.details["context_tokens"] == CONTEXT
    assert error.details["prompt_tokens"] > CONTEXT
    assert "too long for model 'smollm2-135m'" in error.message
    assert "compaction" in error.message
