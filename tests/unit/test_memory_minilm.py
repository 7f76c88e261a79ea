"""The default embedder: all-MiniLM-L6-v2 int8 on onnxruntime, checked against float64
reference vectors computed from the original fp32 weights
(services/memory/scripts/minilm_reference.py), and against what a memory search needs."""

import json
import math
from pathlib import Path

import pytest

from runbus_memory.errors import EmbedderConfigError
from runbus_memory.minilm import MiniLMEmbedder

REFERENCE = json.loads((Path(__file__).parent / "memory_minilm_reference.json").read_text())


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder.load_now()


def test_vectors_match_the_fp32_reference_of_the_model(minilm: MiniLMEmbedder) -> None:
    texts = [item["text"] for item in REFERENCE["vectors"]]

    vectors = minilm.vectors(texts)

    for item, vector in zip(REFERENCE["vectors"], vectors, strict=True):
        assert cosine(vector, item["vector"]) >= 0.999, item["text"]


def test_vectors_have_384_dimensions_and_unit_length(minilm: MiniLMEmbedder) -> None:
    (vector,) = minilm.vectors(["I always want a window seat"])

    assert len(vector) == minilm.dimension == 384
    assert math.sqrt(sum(v * v for v in vector)) == pytest.approx(1.0, abs=1e-5)


def test_a_text_embeds_the_same_alone_and_in_a_batch_of_longer_ones(
    minilm: MiniLMEmbedder,
) -> None:
    text = "My dog is called Rex."
    batch = [f"A much longer sentence number {n} that pads the short one a lot." for n in range(40)]

    (alone,) = minilm.vectors([text])
    together = minilm.vectors([*batch[:20], text, *batch[20:]])

    assert cosine(alone, together[20]) >= 0.9999
    assert len(together) == 41


async def test_embed_runs_off_the_event_loop_and_keeps_the_order(minilm: MiniLMEmbedder) -> None:
    texts = ["short", "a somewhat longer sentence about trains", "mid length text"]

    assert await minilm.embed(texts) == minilm.vectors(texts)


def test_meaning_is_matched_without_shared_words(minilm: MiniLMEmbedder) -> None:
    memories = ["Remember that I always want a window seat.", "My dog is called Rex."]
    query, *stored = minilm.vectors(["Which pet do I have?", *memories])

    scores = [cosine(query, vector) for vector in stored]

    assert scores[1] > scores[0] + 0.2


def test_the_window_seat_ranks_first_among_a_users_memories_for_a_booking(
    minilm: MiniLMEmbedder,
) -> None:
    memories = [
        "Remember that I always want a window seat.",
        "My dog is called Rex.",
        "I am allergic to peanuts.",
        "I prefer vegetarian food.",
    ]
    query, *stored = minilm.vectors(
        ["Book me a flight from Melbourne to Sydney next Tuesday.", *memories]
    )

    ranked = sorted(zip((cosine(query, v) for v in stored), memories, strict=True), reverse=True)

    assert ranked[0][1] == "Remember that I always want a window seat."


def test_a_model_file_that_is_not_the_tested_one_is_refused(tmp_path: Path) -> None:
    tampered = tmp_path / "model.onnx"
    tampered.write_bytes(b"not the model")

    with pytest.raises(EmbedderConfigError, match="sha256 differs"):
        MiniLMEmbedder.load_now(model=tampered)


def test_a_missing_model_file_is_a_clear_start_up_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderConfigError, match="cannot read"):
        MiniLMEmbedder.load_now(model=tmp_path / "missing.onnx")
