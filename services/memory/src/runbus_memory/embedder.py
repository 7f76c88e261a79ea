"""The embedder interface, the lexical hashing embedder (tests, no model), the lazy wrapper
that loads a model at its first use, and the choice of embedder from settings. The packaged
models live in `minilm.py` (English, the default) and `use.py` (multilingual), the HTTP one in
`remote.py`."""

import asyncio
import hashlib
import itertools
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import structlog

from runbus.progress import retrying
from runbus.settings import Settings, SettingsError

from .catalog import MINILM_DIMENSION, MINILM_NAME, USE_DIMENSION, USE_NAME
from .errors import EmbedderUnavailable, VectorSizeMismatch

log = structlog.get_logger()

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
# A CJK character is a word of its own (its neighbours make the pairs): CJK text has no spaces.
_WORD = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")


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


class LazyEmbedder:
    """An embedder whose model loads apart from the service's start: the service is ready
    without it (its name and vector size are known up front, so the store opens), and
    `warm` loads it in the background so the first search does not wait for it."""

    def __init__(self, name: str, dimension: int, load: Callable[[], Awaitable[Embedder]]) -> None:
        self.name = name
        self.dimension = dimension
        self._load = load
        self._loaded: Embedder | None = None
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return await (await self._model()).embed(texts)

    async def warm(self) -> None:
        """Load the model now. A failure is logged; the first use tries again and reports it."""
        try:
            await self._model()
        except Exception as exc:  # a missing or corrupt model file: the first use says so
            log.warning("embedder_warm_failed", embedder=self.name, error=repr(exc))

    async def _model(self) -> Embedder:
        if self._loaded is None:
            async with self._lock:
                if self._loaded is None:
                    log.info("embedder_loading", embedder=self.name)
                    began = time.monotonic()
                    model = await self._load()
                    if model.dimension != self.dimension:
                        raise VectorSizeMismatch(self.name, model.dimension, self.dimension)
                    self._loaded = model
                    log.info(
                        "embedder_loaded",
                        embedder=self.name,
                        seconds=round(time.monotonic() - began, 3),
                    )
        return self._loaded

    async def close(self) -> None:
        if self._loaded is not None:
            await self._loaded.close()


async def _load_minilm() -> Embedder:
    from .minilm import MiniLMEmbedder  # onnxruntime loads only when chosen and used

    return await MiniLMEmbedder.load()


async def _load_use() -> Embedder:
    from .use import USEEmbedder  # its 128k-piece vocabulary loads only when chosen and used

    return await USEEmbedder.load()


PACKAGED: Final[dict[str, tuple[str, int, Callable[[], Awaitable[Embedder]]]]] = {
    "minilm": (MINILM_NAME, MINILM_DIMENSION, _load_minilm),
    "use": (USE_NAME, USE_DIMENSION, _load_use),
}
"""`RUNBUS_EMBEDDER` values of the models inside runbus-memory's dependencies: model id,
vector size, loader."""


def packaged_embedder(choice: str) -> LazyEmbedder:
    """The packaged model `choice` names, loaded at its first use."""
    try:
        name, dimension, load = PACKAGED[choice]
    except KeyError:
        raise SettingsError(
            "RUNBUS_EMBEDDER", f"{choice!r} is not one of hashing, openai, {', '.join(PACKAGED)}"
        ) from None
    return LazyEmbedder(name, dimension, load)


def embeddings_down(url: str | None) -> Callable[[Exception], str | None]:
    """The start-up reason of an embeddings server that does not answer (retried)."""

    def reason(exc: Exception) -> str | None:
        if isinstance(exc, EmbedderUnavailable):
            return f"embeddings server at {url} (RUNBUS_EMBEDDINGS_URL): {exc.reason}"
        return None

    return reason


async def embedder_from_settings(settings: Settings) -> Embedder:
    """The embedder `RUNBUS_EMBEDDER` names. A packaged model loads at its first use; the
    `openai` one is asked once now for its vector size (so a wrong endpoint fails at start), and
    while its server is down that is said and tried again."""
    match settings.embedder:
        case "hashing":
            return HashingEmbedder()
        case "openai":
            try:
                from .remote import OpenAIEmbedder
            except ModuleNotFoundError as exc:  # installed without the `openai` extra
                raise SettingsError(
                    "RUNBUS_EMBEDDER",
                    f"'openai' needs the {exc.name} package: install runbus-memory[openai]",
                ) from None

            return await retrying(
                "asking the embeddings server for its vector size",
                lambda: OpenAIEmbedder.connect(
                    settings.embeddings_url,
                    settings.embeddings_model,
                    dimension=settings.embeddings_dimension,
                    api_key_env=settings.embeddings_api_key_env,
                ),
                down=embeddings_down(settings.embeddings_url),
            )
        case packaged:
            return packaged_embedder(packaged)
