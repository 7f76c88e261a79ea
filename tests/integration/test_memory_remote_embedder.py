"""The OpenAI-compatible embedder against a loopback provider over real HTTP: the production
client code, the vector size learnt or asked for, failures as typed errors."""

import math

import pytest

from runbus_memory.embedder import HashingEmbedder
from runbus_memory.errors import EmbedderConfigError, EmbedderUnavailable
from runbus_memory.remote import OpenAIEmbedder

from .memory_embeddings import embeddings_provider

MODEL = "text-embedding-3-small"


def unit_length(vector: list[float]) -> float:
    return math.sqrt(sum(v * v for v in vector))


async def test_the_vector_size_is_learnt_from_the_provider_at_connect() -> None:
    async with embeddings_provider(dimension=256) as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, MODEL)
        try:
            assert embedder.dimension == 256
            assert embedder.name == MODEL
            assert "dimensions" not in provider.requests[0]
        finally:
            await embedder.close()


async def test_vectors_come_back_in_input_order_and_of_unit_length() -> None:
    texts = ["I always want a window seat", "my dog is called Rex", "trains"]
    async with embeddings_provider(reverse=True) as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, MODEL)
        try:
            vectors = await embedder.embed(texts)
        finally:
            await embedder.close()

    for got, want in zip(vectors, HashingEmbedder().vectors(texts), strict=True):
        assert got == pytest.approx(want)
    assert [unit_length(v) for v in vectors] == pytest.approx([1.0, 1.0, 1.0])
    assert provider.requests[-1] == {"model": MODEL, "input": texts, "encoding_format": "float"}


async def test_a_configured_size_is_asked_for_in_every_request() -> None:
    async with embeddings_provider() as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, MODEL, dimension=128)
        try:
            (vector,) = await embedder.embed(["window seat"])
        finally:
            await embedder.close()

    assert len(vector) == embedder.dimension == 128
    assert [r["dimensions"] for r in provider.requests] == [128, 128]


async def test_a_provider_that_ignores_the_configured_size_fails_at_start() -> None:
    async with embeddings_provider(dimension=64, honour_dimensions=False) as provider:
        with pytest.raises(EmbedderConfigError, match="size 64"):
            await OpenAIEmbedder.connect(provider.url, MODEL, dimension=384)


async def test_a_failing_provider_is_an_embedder_unavailable_error() -> None:
    async with embeddings_provider() as provider:
        embedder = await OpenAIEmbedder.connect(provider.url, MODEL, max_retries=0)
        provider.status = 500
        try:
            with pytest.raises(EmbedderUnavailable, match="HTTP 500") as raised:
                await embedder.embed(["window seat"])
        finally:
            await embedder.close()

    assert raised.value.code == "embedder_unavailable"


async def test_an_unreachable_provider_fails_at_start() -> None:
    async with embeddings_provider() as provider:
        url = provider.url
    with pytest.raises(EmbedderUnavailable):
        await OpenAIEmbedder.connect(url, MODEL, max_retries=0)


async def test_the_key_is_read_from_the_named_variable_and_sent_as_a_bearer_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RB_TEST_EMBEDDINGS_KEY", "sk-loopback")
    async with embeddings_provider() as provider:
        embedder = await OpenAIEmbedder.connect(
            provider.url, MODEL, api_key_env="RB_TEST_EMBEDDINGS_KEY"
        )
        await embedder.close()

    assert provider.authorizations == ["Bearer sk-loopback"]


async def test_a_named_key_variable_that_is_not_set_fails_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RB_TEST_EMBEDDINGS_KEY", raising=False)

    with pytest.raises(EmbedderConfigError, match="RB_TEST_EMBEDDINGS_KEY is not set"):
        await OpenAIEmbedder.connect(
            "http://127.0.0.1:9/v1", MODEL, api_key_env="RB_TEST_EMBEDDINGS_KEY"
        )


async def test_without_a_url_the_openai_embedder_fails_at_start() -> None:
    with pytest.raises(EmbedderConfigError, match="RUNBUS_EMBEDDINGS_URL"):
        await OpenAIEmbedder.connect(None, MODEL)
