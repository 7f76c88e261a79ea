"""The labelled evaluation set (`data/eval.json`) and how the store policies and recall are
scored on it, without a bus: store precision and recall per policy, recall@k and the empty rate
of a relevance threshold per embedder, supersessions on contradiction pairs. The tests assert on
it (`tests/unit/test_memory_eval.py`); `bench/memory_eval.py` prints it, with a real model.

`scripted_facts` is the deterministic model the tests use: it answers every fact a competent
model would, and is fooled by every utterance it should refuse (an instruction, a claim of
authority) — what is left out is left out by the trust rules, not by the script.
"""

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any, Final

from runbus.memory_rules import statements

from .catalog import MINILM_NAME
from .core import MemoryRecord, StorageScope, memory_id, normalise
from .embedder import Embedder
from .reconcile import Fact, plan

REFUSED_KINDS: Final = frozenset({"request", "question", "instruction", "authority", "smalltalk"})
"""Kinds of utterance of which nothing may be stored."""
MATCH: Final = 0.6
"""Character-bigram Dice similarity at which a stored text counts as a labelled fact (a model
words a fact its own way: "I live in Perth" for "I moved to Perth")."""
SCOPE: Final = StorageScope(tenant="eval", user_id="u", session_id="s", agent_id="eval")
AT: Final = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Utterance:
    id: str
    lang: str
    kind: str
    text: str
    facts: list[str]


@dataclass(frozen=True)
class RecallQuery:
    id: str
    lang: str
    query: str
    relevant: list[str]
    """Memories the query should recall; empty: nothing should be injected."""


@dataclass(frozen=True)
class Contradiction:
    id: str
    lang: str
    old: str
    text: str
    """What the user says later."""
    fact: str
    """The memory that should replace `old`."""


@dataclass(frozen=True)
class EvalSet:
    utterances: list[Utterance]
    recall: list[RecallQuery]
    contradictions: list[Contradiction]

    def memories(self, lang: str) -> list[str]:
        """A user's memories for recall in `lang`: every labelled fact of the language."""
        return list(dict.fromkeys(f for u in self.utterances if u.lang == lang for f in u.facts))


def load() -> EvalSet:
    raw: dict[str, Any] = json.loads(
        resources.files("runbus_memory").joinpath("data/eval.json").read_text("utf-8")
    )
    return EvalSet(
        utterances=[Utterance(**u) for u in raw["utterances"]],
        recall=[RecallQuery(**r) for r in raw["recall"]],
        contradictions=[Contradiction(**c) for c in raw["contradictions"]],
    )


def scripted_facts(utterance: Utterance) -> list[Fact]:
    """The scripted model's answer: the labelled facts, and the utterance itself as a fact
    when nothing of it may be stored (a model talked into keeping it)."""
    facts = [Fact(text=f, action="add") for f in utterance.facts]
    if utterance.kind in REFUSED_KINDS:
        facts.append(Fact(text=utterance.text, action="add"))
    return facts


def rules_policy(utterance: Utterance) -> list[str]:
    """What the deterministic policy stores of one utterance."""
    return list(dict.fromkeys(statements(utterance.text)))


def model_policy(facts: list[Fact], utterance: Utterance) -> list[str]:
    """What the model policy stores of a model's answer for one utterance (no memories yet):
    the facts that pass the trust rules."""
    return [r.text for r in plan(facts, [], SCOPE, "eval", AT, [utterance.text]).stored]


def similarity(a: str, b: str) -> float:
    """Dice coefficient of the character bigrams of the normalised texts (1.0 when equal)."""
    x, y = normalise(a), normalise(b)
    if x == y:
        return 1.0
    pairs_x = [x[i : i + 2] for i in range(len(x) - 1)]
    pairs_y = [y[i : i + 2] for i in range(len(y) - 1)]
    if not pairs_x or not pairs_y:
        return 0.0
    common = 0
    pool = list(pairs_y)
    for pair in pairs_x:
        if pair in pool:
            pool.remove(pair)
            common += 1
    return 2 * common / (len(pairs_x) + len(pairs_y))


@dataclass
class StoreScore:
    stored: int = 0
    correct: int = 0
    facts: int = 0
    found: int = 0
    wrong: list[tuple[str, str]] = field(default_factory=list)
    """(utterance id, stored text) of every stored text that is no labelled fact."""

    @property
    def precision(self) -> float:
        return self.correct / self.stored if self.stored else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.facts if self.facts else 1.0

    def add(self, utterance: Utterance, stored: list[str]) -> None:
        self.facts += len(utterance.facts)
        self.found += sum(any(similarity(s, f) >= MATCH for s in stored) for f in utterance.facts)
        for text in stored:
            self.stored += 1
            if any(similarity(text, f) >= MATCH for f in utterance.facts):
                self.correct += 1
            else:
                self.wrong.append((utterance.id, text))


def score_store(
    utterances: Iterable[Utterance], policy: Callable[[Utterance], list[str]]
) -> dict[str, StoreScore]:
    """Store precision and recall of `policy` per language and over all (`"all"`)."""
    scores: dict[str, StoreScore] = {"all": StoreScore()}
    for utterance in utterances:
        stored = policy(utterance)
        scores["all"].add(utterance, stored)
        scores.setdefault(utterance.lang, StoreScore()).add(utterance, stored)
    return scores


@dataclass(frozen=True)
class RecallScore:
    threshold: float
    k: int
    recall_at_k: float
    """Of the queries with relevant memories: those with one in the top k above threshold."""
    empty_rate: float
    """Of the queries with no relevant memory: those for which nothing passes the threshold."""

    @property
    def value(self) -> float:
        """What a threshold is chosen by: recall@k counted twice, the empty rate once. A
        memory missed costs the user a repeat and the feature its point; an irrelevant one
        injected is fenced background the model can pass over."""
        return 2 * self.recall_at_k + self.empty_rate


async def ranked_scores(embedder: Embedder, evaluation: EvalSet) -> list[list[tuple[str, float]]]:
    """For each recall query, the user's memories (its language's facts) by cosine, best first
    with recency as the tie-breaker as the service ranks them (later facts are newer)."""
    ranked = []
    for query in evaluation.recall:
        memories = evaluation.memories(query.lang)
        vectors = await embedder.embed([query.query, *memories])
        q = vectors[0]
        scored = [
            (text, _cosine(q, v), index)
            for index, (text, v) in enumerate(zip(memories, vectors[1:], strict=True))
        ]
        scored.sort(key=lambda item: (-round(item[1], 2), -item[2]))
        ranked.append([(text, score) for text, score, _ in scored])
    return ranked


def score_recall(
    evaluation: EvalSet, ranked: list[list[tuple[str, float]]], k: int, threshold: float
) -> RecallScore:
    hits = relevant_queries = empty = empty_queries = 0
    for query, scored in zip(evaluation.recall, ranked, strict=True):
        recalled = [text for text, score in scored if score >= threshold][:k]
        if query.relevant:
            relevant_queries += 1
            hits += any(text in query.relevant for text in recalled)
        else:
            empty_queries += 1
            empty += not recalled
    return RecallScore(
        threshold=threshold,
        k=k,
        recall_at_k=hits / relevant_queries if relevant_queries else 1.0,
        empty_rate=empty / empty_queries if empty_queries else 1.0,
    )


def score_recall_by_language(
    evaluation: EvalSet, ranked: list[list[tuple[str, float]]], k: int, threshold: float
) -> dict[str, RecallScore]:
    """`score_recall` of each language's queries, and of all (`"all"`)."""
    scores = {"all": score_recall(evaluation, ranked, k, threshold)}
    for lang in dict.fromkeys(q.lang for q in evaluation.recall):
        picked = [i for i, q in enumerate(evaluation.recall) if q.lang == lang]
        part = EvalSet(
            evaluation.utterances, [evaluation.recall[i] for i in picked], evaluation.contradictions
        )
        scores[lang] = score_recall(part, [ranked[i] for i in picked], k, threshold)
    return scores


def choose_threshold(
    evaluation: EvalSet, ranked: list[list[tuple[str, float]]], k: int
) -> RecallScore:
    """The threshold (0.00 to 0.60 by 0.05) of the highest `RecallScore.value`; of equal ones,
    the lowest."""
    candidates = [score_recall(evaluation, ranked, k, t) for t in THRESHOLDS]
    return max(candidates, key=lambda s: (round(s.value, 6), -s.threshold))


THRESHOLDS: Final = [t / 100 for t in range(0, 61, 5)]
CALIBRATION_LANGUAGES: Final[dict[str, tuple[str, ...]]] = {
    MINILM_NAME: ("en",),
}
"""The recall queries an embedder's threshold is chosen on (an embedder not named: all of them,
as for the multilingual USE): MiniLM is an English model, and on the other languages its scores
do not tell relevant memories from the rest (bench)."""


def calibration_set(evaluation: EvalSet, embedder: str) -> EvalSet:
    """The part of the set `embedder`'s threshold is chosen on."""
    languages = CALIBRATION_LANGUAGES.get(embedder)
    if languages is None:
        return evaluation
    queries = [q for q in evaluation.recall if q.lang in languages]
    return EvalSet(evaluation.utterances, queries, evaluation.contradictions)


def contradiction_records(contradiction: Contradiction) -> MemoryRecord:
    """The old memory of a contradiction pair, as stored before the user's new statement."""
    return MemoryRecord(memory_id(SCOPE, contradiction.old), contradiction.old, SCOPE, AT)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
