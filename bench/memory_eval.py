"""Memory quality on the shipped labelled evaluation set (runbus_memory/data/eval.json):

1. store precision and recall, per language and over all, of the deterministic rules; of the
   model policy with the scripted model (the labelled facts, and fooled by every utterance it
   should refuse: the trust rules must hold); and of the model policy with a real model —
   SmolLM2-135M on llama.cpp, called through model_router on the bus with the prompt, schema
   and checks the memory service uses;
2. recall@1/3/5 and the empty rate (queries with no relevant memory that get none) of each
   embedder at its default threshold, per language, and the threshold sweep the default was
   chosen from; each packaged model's load time and time per embedding of one query;
3. contradiction pairs superseded under the model policy (scripted and real).
"""

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from tests.stack import start_stack

from runbus import ops, subjects
from runbus.embedded import EmbeddedNats
from runbus.errors import remote_error
from runbus.headers import RunContext
from runbus.local_model import LocalModelServer, LocalModelUnavailable, router_toml
from runbus.logs import configure_logging
from runbus.messages import ModelRequest, encode
from runbus_memory.core import RELEVANCE, MemoryRecord
from runbus_memory.embedder import Embedder, HashingEmbedder
from runbus_memory.evaluation import (
    AT,
    SCOPE,
    THRESHOLDS,
    EvalSet,
    StoreScore,
    calibration_set,
    choose_threshold,
    contradiction_records,
    load,
    model_policy,
    ranked_scores,
    rules_policy,
    score_recall,
    score_recall_by_language,
    score_store,
    scripted_facts,
)
from runbus_memory.minilm import MiniLMEmbedder
from runbus_memory.reconcile import OUTPUT, ExtractionInvalid, Fact, parse, plan, prompt
from runbus_memory.use import USEEmbedder
from runbus_model_router.config import parse_config

CTX = RunContext(run_id="eval", agent="eval", props={"tenant": "eval", "user_id": "u"})
MAX_TOKENS = 160
"""Tokens of one extraction answer at most: a few short facts."""


def _row(name: str, scores: dict[str, StoreScore]) -> None:
    cells = "  ".join(
        f"{lang} {s.precision:4.2f}/{s.recall:4.2f}" for lang, s in scores.items() if lang != "all"
    )
    total = scores["all"]
    print(
        f"  {name:<26} precision {total.precision:5.3f}  recall {total.recall:5.3f}"
        f"  ({total.stored} stored, {total.facts} facts)   {cells}"
    )
    for utterance_id, text in total.wrong:
        print(f"      not a labelled fact: {utterance_id}: {text!r}")


async def _recall(evaluation: EvalSet, embedder: Embedder) -> None:
    ranked = await ranked_scores(embedder, evaluation)
    threshold = RELEVANCE.get(embedder.name, -1.0)
    shown = "none" if threshold < 0 else f"{threshold:.2f}"
    print(f"  {embedder.name} (default threshold {shown}):")
    by_k = {k: score_recall_by_language(evaluation, ranked, k, threshold) for k in (1, 3, 5)}
    for lang in by_k[5]:
        cells = "  ".join(f"recall@{k} {by_k[k][lang].recall_at_k:4.2f}" for k in by_k)
        queries = sum(lang in ("all", q.lang) for q in evaluation.recall)
        print(f"    {lang:<4} {cells}  empty {by_k[5][lang].empty_rate:4.2f}  ({queries} queries)")
    calibration = calibration_set(evaluation, embedder.name)
    ranked_calibration = await ranked_scores(embedder, calibration)
    sweep = [score_recall(calibration, ranked_calibration, 5, t) for t in THRESHOLDS]
    chosen = choose_threshold(calibration, ranked_calibration, 5)
    languages = "+".join(sorted({q.lang for q in calibration.recall}))
    print(
        f"    sweep on {languages} at top-5 (threshold: recall@5/empty): "
        + "  ".join(f"{s.threshold:.2f}: {s.recall_at_k:.2f}/{s.empty_rate:.2f}" for s in sweep)
    )
    print(f"    chosen (2 x recall@5 + empty, lowest of ties): {chosen.threshold:.2f}")


async def _loaded(load: Callable[[], Awaitable[Embedder]], evaluation: EvalSet) -> Embedder:
    """The model, after printing its load time and the time to embed one query (median)."""
    started = time.perf_counter()
    embedder = await load()
    took = time.perf_counter() - started
    times = []
    for query in evaluation.recall:
        began = time.perf_counter()
        await embedder.embed([query.query])
        times.append(time.perf_counter() - began)
    median = sorted(times)[len(times) // 2]
    print(
        f"  {embedder.name}: loads in {took:.2f} s; one query embeds in {median * 1000:.1f} ms "
        f"(median of {len(times)})"
    )
    return embedder


def _contradictions_scripted(evaluation: EvalSet) -> int:
    superseded = 0
    for contradiction in evaluation.contradictions:
        old = contradiction_records(contradiction)
        facts = [Fact(text=contradiction.fact, action="update", replaces=[0])]
        made = plan(facts, [old], SCOPE, contradiction.id, AT)
        superseded += [r.memory_id for r in made.retired] == [old.memory_id]
    return superseded


async def _extract(
    nc: NATS, texts: list[str], candidates: list[MemoryRecord]
) -> tuple[list[Fact], bool]:
    request = ModelRequest(
        route="local",
        messages=prompt(texts, candidates),
        response_format=OUTPUT,
        temperature=0.0,
        seed=7,
        max_output_tokens=MAX_TOKENS,
    )
    reply = await nc.request(
        subjects.MODEL_COMPLETE, encode(request), headers=CTX.to_headers(), timeout=120
    )
    if remote_error(reply.headers, reply.data) is not None:
        return [], False
    text = ops.MODEL_COMPLETE.decode_reply.decode(reply.data).message.text
    try:
        return parse(text), True
    except ExtractionInvalid:
        return [], False


async def _real_model(evaluation: EvalSet) -> None:
    try:
        server = LocalModelServer(slots=1, threads=2).start()
    except LocalModelUnavailable as exc:
        print(f"  real model: not measured ({exc})")
        return
    try:
        with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as nats_server:
            async with start_stack(
                nats_server.url,
                data_dir=Path(tmp) / "data",
                router_config=parse_config(router_toml(server.base_url)),
            ):
                nc = await nats.connect(nats_server.url)
                answers: dict[str, list[Fact]] = {}
                invalid = 0
                started = time.perf_counter()
                for utterance in evaluation.utterances:
                    facts, valid = await _extract(nc, [utterance.text], [])
                    answers[utterance.id] = facts
                    invalid += not valid
                took = time.perf_counter() - started
                superseded = 0
                for contradiction in evaluation.contradictions:
                    old = contradiction_records(contradiction)
                    facts, _ = await _extract(nc, [contradiction.text], [old])
                    made = plan(facts, [old], SCOPE, contradiction.id, AT, [contradiction.text])
                    superseded += [r.memory_id for r in made.retired] == [old.memory_id]
                await nc.drain()
    finally:
        server.stop()
    scores = score_store(evaluation.utterances, lambda u: model_policy(answers[u.id], u))
    _row("model policy, SmolLM2-135M", scores)
    extracted = sum(len(f) for f in answers.values())
    print(
        f"      {extracted} facts extracted, {invalid} answers not the schema's JSON; "
        f"{took / len(evaluation.utterances) * 1000:.0f} ms per extraction"
    )
    print(
        f"  contradictions superseded, SmolLM2-135M: {superseded}/{len(evaluation.contradictions)}"
    )


async def run_benchmark(real_model: bool = True) -> None:
    configure_logging("warning")
    evaluation = load()
    languages = sorted({u.lang for u in evaluation.utterances})
    print(
        f"memory evaluation set: {len(evaluation.utterances)} utterances in "
        f"{', '.join(languages)}; {len(evaluation.recall)} recall queries; "
        f"{len(evaluation.contradictions)} contradiction pairs"
    )
    print("store (precision/recall by language):")
    _row("rules (deterministic)", score_store(evaluation.utterances, rules_policy))
    _row(
        "model policy, scripted",
        score_store(evaluation.utterances, lambda u: model_policy(scripted_facts(u), u)),
    )
    print(
        f"  contradictions superseded, scripted: "
        f"{_contradictions_scripted(evaluation)}/{len(evaluation.contradictions)}; "
        f"rules: 0/{len(evaluation.contradictions)} (the rules never reconcile)"
    )
    if real_model:
        await _real_model(evaluation)
    print("recall (the user's memories: every labelled fact of the query's language):")
    minilm = await _loaded(MiniLMEmbedder.load, evaluation)
    use = await _loaded(USEEmbedder.load, evaluation)
    for embedder in (HashingEmbedder(), minilm, use):
        await _recall(evaluation, embedder)


if __name__ == "__main__":
    asyncio.run(run_benchmark())
