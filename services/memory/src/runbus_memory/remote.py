"""The production embedder: any OpenAI-compatible `/embeddings` endpoint (OpenAI, Azure OpenAI,
Ollama, vLLM, llama.cpp, text-embeddings-inference) through the official `openai` SDK."""

import math
import os
from typing import Any, Final, Self

import openai
from openai import AsyncOpenAI

from .errors import EmbedderConfigError, EmbedderUnavailable

NO_KEY: Final = "not-needed"
"""Sent when no key is configured: local servers ignore it, the SDK insists on one."""
PROBE: Final = "runbus embedding probe"
TIMEOUT: Final = 30.0
MAX_BATCH: Final = 256
"""Texts per request; OpenAI accepts up to 2048 inputs, smaller servers far fewer."""


class OpenAIEmbedder:
    def __init__(
        self, client: AsyncOpenAI, model: str, dimension: int, *, request_dimension: bool
    ) -> None:
        self.client = client
        self.model = model
        self.name = model
        self.dimension = dimension
        self.request_dimension = request_dimension

    @classmethod
    async def connect(
        cls,
        url: str | None,
        model: str,
        *,
        dimension: int | None = None,
        api_key_env: str | None = None,
        timeout: float = TIMEOUT,
        max_retries: int = 2,
    ) -> Self:
        """A client for `url`, with the vector size asked for (`dimension`) or, when None,
        learnt from one probe request, so a wrong endpoint fails at start."""
        if not url:
            raise EmbedderConfigError(
                "RUNBUS_EMBEDDER=openai needs RUNBUS_EMBEDDINGS_URL (the API's base URL)"
            )
        key = NO_KEY
        if api_key_env:
            key = os.environ.get(api_key_env, "")
            if not key:
                raise EmbedderConfigError(
                    f"RUNBUS_EMBEDDINGS_API_KEY_ENV: {api_key_env} is not set"
                )
        client = AsyncOpenAI(base_url=url, api_key=key, timeout=timeout, max_retries=max_retries)
        embedder = cls(client, model, dimension or 0, request_dimension=dimension is not None)
        (probe,) = await embedder.embed([PROBE])
        if dimension is not None and len(probe) != dimension:
            await client.close()
            raise EmbedderConfigError(
                f"{url!r} answered vectors of size {len(probe)} for model {model!r}, "
                f"not the {dimension} RUNBUS_EMBEDDINGS_DIMENSION asks for"
            )
        embedder.dimension = len(probe)
        return embedder

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), MAX_BATCH):
            vectors.extend(await self._request(texts[start : start + MAX_BATCH]))
        return vectors

    async def _request(self, texts: list[str]) -> list[list[float]]:
        options: dict[str, Any] = {"dimensions": self.dimension} if self.request_dimension else {}
        try:
            response = await self.client.embeddings.create(
                model=self.model, input=texts, encoding_format="float", **options
            )
        except openai.APIError as exc:
            raise EmbedderUnavailable(str(self.client.base_url), _reason(exc)) from None
        data = sorted(response.data, key=lambda d: d.index)
        if len(data) != len(texts):
            raise EmbedderUnavailable(
                str(self.client.base_url), f"{len(data)} vectors for {len(texts)} texts"
            )
        # OpenAI's vectors are unit length; other servers' are not always, and score
        # thresholds assume cosine similarity.
        return [_unit(item.embedding) for item in data]

    async def close(self) -> None:
        await self.client.close()


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def _reason(exc: openai.APIError) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return type(exc).__name__ if not str(exc) else str(exc)
