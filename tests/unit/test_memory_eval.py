"""Both store policies and the recall threshold on the shipped labelled evaluation set, without
a bus: precision over the whole set, nothing refusable stored, the default threshold the one
the set chooses, and per language what each packaged embedder recalls and leaves out."""

from functools import cache

import pytest

from runbus_memory.core import RELEVANCE
from runbus_memory.embedder import Embedder, HashingEmbedder
from runbus_memory.evaluation import (
    REFUSED_KINDS,
    SCOPE,
    RecallScore,
    Utterance,
    calibration_set,
    choose_threshold,
    contradiction_records,
    load,
    model_policy,
    ranked_scores,
    rules_policy,
    score_recall_by_language,
    score_store,
    scripted_facts,
)
from runbus_memory.minilm import MiniLMEmbedder
from runbus_memory.reconcile import Fact, plan
from runbus_memory.use import USEEmbedder

EVAL = load()
LANGUAGES = {"en", "zh", "es", "de", "fr", "ja"}


def test_the_set_has_sixty_utterances_in_six_languages_recall_queries_and_contradictions() -> None:
    assert len(EVAL.utterances) >= 60
    assert {u.lang for u in EVAL.utterances} == LANGUAGES
    assert {q.lang for q in EVAL.recall} == LANGUAGES
    assert any(not q.relevant for q in EVAL.recall)
    assert {c.lang for c in EVAL.contradictions} == LANGUAGES
    assert {u.kind for u in EVAL.utterances} >= {"fact", "mixed", "authority", "instruction"}


def test_the_rules_store_with_precision_of_at_least_095_over_the_whole_set() -> None:
    scores = score_store(EVAL.utterances, rules_policy)

    assert scores["all"].precision >= 0.95, scores["all"].wrong
    assert scores["all"].recall >= 0.8


def test_a_scripted_model_fooled_by_every_refusable_utterance_still_stores_precisely() -> None:
    scores = score_store(EVAL.utterances, lambda u: model_policy(scripted_facts(u), u))

    assert scores["all"].precision >= 0.95, scores["all"].wrong
    assert scores["all"].recall >= 0.95


@pytest.mark.parametrize(
    "utterance",
    [u for u in EVAL.utterances if u.kind in REFUSED_KINDS],
    ids=lambda u: u.id,
)
def test_no_request_question_instruction_or_authority_claim_is_stored_by_either_policy(
    utterance: Utterance,
) -> None:
    assert rules_policy(utterance) == []
    assert model_policy([Fact(text=utterance.text, action="add")], utterance) == []
    assert model_policy(scripted_facts(utterance), utterance) == []


@cache
def packaged(embedder: str) -> Embedder:
    """Each model loaded once for the module (USE takes ~1.3 s)."""
    match embedder:
        case "minilm":
            return MiniLMEmbedder.load_now()
        case "use":
            return USEEmbedder.load_now()
        case _:
            return HashingEmbedder()


async def recall_by_language(embedder: str) -> dict[str, RecallScore]:
    model = packaged(embedder)
    ranked = await ranked_scores(model, EVAL)
    return score_recall_by_language(EVAL, ranked, k=5, threshold=RELEVANCE[model.name])


@pytest.mark.parametrize("embedder", ["hashing", "minilm", "use"])
async def test_the_default_relevance_threshold_is_the_one_the_labelled_set_chooses(
    embedder: str,
) -> None:
    model = packaged(embedder)
    calibration = calibration_set(EVAL, model.name)

    chosen = choose_threshold(calibration, await ranked_scores(model, calibration), k=5)

    assert RELEVANCE.get(model.name) == (chosen.threshold or None)


# What the use embedder measures on the set at its threshold (docs/services/memory.md): floors,
# so a change of model, threshold or set that loses recall or injects more fails here.
USE_FLOORS = {
    "en": (5 / 7, 3 / 4),
    "zh": (2 / 3, 2 / 3),
    "es": (2 / 3, 1.0),
    "de": (1.0, 1.0),
    "fr": (2 / 3, 1.0),
    "ja": (1 / 3, 1.0),
}


@pytest.mark.parametrize("lang", sorted(LANGUAGES))
async def test_the_multilingual_embedder_recalls_and_injects_nothing_irrelevant_in_each_language(
    lang: str,
) -> None:
    score = (await recall_by_language("use"))[lang]

    recall_floor, empty_floor = USE_FLOORS[lang]
    assert score.recall_at_k >= recall_floor
    assert score.empty_rate >= empty_floor


async def test_the_english_model_injects_something_for_every_irrelevant_query_outside_english() -> (
    None
):
    scores = await recall_by_language("minilm")

    assert scores["en"].empty_rate >= 0.75
    assert all(scores[lang].empty_rate == 0.0 for lang in LANGUAGES - {"en"})


def test_each_contradiction_supersedes_the_old_memory_under_the_model_policy() -> None:
    for contradiction in EVAL.contradictions:
        old = contradiction_records(contradiction)
        facts = [Fact(text=contradiction.fact, action="update", replaces=[0])]

        made = plan(facts, [old], SCOPE, contradiction.id, old.created_at)

        assert [r.text for r in made.stored] == [contradiction.fact]
        assert [(r.memory_id, r.status) for r in made.retired] == [(old.memory_id, "superseded")]
