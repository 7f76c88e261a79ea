"""Recall through the memory service with the multilingual embedder (`RUNBUS_EMBEDDER=use`)
and its default threshold, in each shipped language: a user holding every labelled memory of
the language (data/eval.json) asks something none of them is about and gets nothing, and asks
for a seat and gets their seat preference."""

from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path

import pytest

from runbus_memory.evaluation import load
from runbus_memory.use import USEEmbedder
from tests.integration.test_memory_service import Deployment, Memory, who
from tests.stack import SecuredNats

EVAL = load()
NOTHING_RELEVANT = {  # what the weather is like: the set's first such query in each language
    lang: next(q for q in EVAL.recall if q.lang == lang and not q.relevant)
    for lang in ("en", "zh", "es", "de", "fr", "ja")
}
SEAT = {
    "en": "recall-en-1",
    "zh": "recall-zh-1",
    "es": "recall-es-2",
    "de": "recall-de-2",
    "fr": "recall-fr-2",
    "ja": "recall-ja-2",
}


@cache
def use() -> USEEmbedder:
    return USEEmbedder.load_now()


@pytest.fixture
async def memory(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Memory]:
    deployment = Deployment(nats_server.url, tmp_path / "store")
    await deployment.start(embedder=use())
    client = await deployment.client()
    for lang in NOTHING_RELEVANT:
        await client.store(who(f"user-{lang}"), *EVAL.memories(lang))
    yield client
    await deployment.close()


@pytest.mark.parametrize("lang", sorted(NOTHING_RELEVANT))
async def test_a_question_no_memory_is_about_recalls_nothing_in_each_language(
    memory: Memory, lang: str
) -> None:
    query = NOTHING_RELEVANT[lang]

    assert await memory.search(who(f"user-{lang}"), query.query) == []


@pytest.mark.parametrize("lang", sorted(SEAT))
async def test_a_question_about_a_seat_recalls_the_seat_preference_in_each_language(
    memory: Memory, lang: str
) -> None:
    query = next(q for q in EVAL.recall if q.id == SEAT[lang])

    recalled = await memory.search(who(f"user-{lang}"), query.query)

    assert set(recalled[:5]) & set(query.relevant)
