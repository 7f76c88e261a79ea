"""The embedder interface, the lexical hashing embedder (tests, no model), and the choice of
embedder from settings. The semantic default lives in `minilm.py`, the HTTP one in `remote.py`."""

import hashlib
import itertools
import math
import re
from typing import Protocol

from runbus.settings import Settings

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    """Turns texts into unit-length vectors of `dimension` floats, one per text, in order."""

    name: str
    """Model id, shown by `memory.stats`."""
    dimension: int

    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    async def close(self) -> None: ...


class HashingEmbedder:
    """Feature hashing of words and word pairs into `dimension` signed buckets, L2-normalised.

    Offline, deterministic, no weights: it matches shared words, not meaning.
    """

    name = "hashing"

    def __init__(self, dimension: int = 384) -> None:
        self.dimension = dimension

    async def embed(self, texts: list[str]) -> list[list[float]]:
        # Microseconds per text: cheaper than a hop to a worker thread.
        return self.vectors(texts)

    def vectors(self, texts: list[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    async def close(self) -> None:
        return None

    def _one(self, text: str) -> list[float]:
        words = _WORD.findall(text.lower())
        features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        vector = [0.0] * self.dimension
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "big") % self.dimension
            vector[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vector))
        return [v / norm for v in vector] if norm else vector


async def embedder_from_settings(settings: Settings) -> Embedder:
    """The embedder `RUNBUS_EMBEDDER` names, loaded and ready (the model read, the endpoint's
    vector size known), so a bad configuration fails at start, not at the first memory."""
    match settings.embedder:
        case "hashing":
            return HashingEmbedder()
        case "minilm":
            from .minilm import MiniLMEmbedder  # onnxruntime loads only when chosen

            return await MiniLMEmbedder.load()
        case "openai":
            from .remote import OpenAIEmbedder

            return await OpenAIEmbedder.connect(
                settings.embeddings_url,
                settings.embeddings_model,
                dimension=settings.embeddings_dimension,
                api_key_env=settings.embeddings_api_key_env,
            )
