"""Memory rules without a bus or a store: scopes, ids, input checks, the `memory_search` tool's
scope forcing, and the hashing embedder."""

import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from runbus.headers import RunContext
from runbus.messages.chat import Source
from runbus.messages.memory import (
    MEMORY_SEARCH_TOOL,
    MEMORY_SEARCH_TOOL_QUERY_MAX,
    MemoryForget,
    MemoryStore,
    SearchScope,
)
from runbus.messages.model import ToolSpec
from runbus_memory.core import (
    MAX_TEXTS,
    MemoryRecord,
    StorageScope,
    distinct,
    forget_selector,
    memory_id,
    normalise,
    records_to_store,
    search_match,
    tool_search,
)
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.errors import (
    BadForget,
    BadTrustedProperty,
    EmptyText,
    MissingIdentity,
    NotStorable,
    SourcesMismatch,
    TooManyTexts,
    UnknownScopeField,
)

ALICE = StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="travel")
ALICE_APP = StorageScope(
    tenant="acme", user_id="alice", session_id="s1", agent_id="travel", application_id="web"
)
ALICE_CTX = RunContext(
    run_id="r1", session_id="s1", agent="travel", props={"tenant": "acme", "user_id": "alice"}
)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def record(scope: StorageScope, text: str) -> MemoryRecord:
    return MemoryRecord(memory_id(scope, text), text, scope, datetime(2026, 1, 1, tzinfo=UTC))


# -- storage scope ---------------------------------------------------------------------------


def test_storage_scope_comes_from_trusted_properties_session_and_agent() -> None:
    assert StorageScope.from_context(ALICE_CTX) == ALICE


def test_storage_scope_takes_the_application_from_its_trusted_property() -> None:
    ctx = RunContext(
        session_id="s1",
        agent="travel",
        props={"tenant": "acme", "user_id": "alice", "application_id": "web"},
    )

    assert StorageScope.from_context(ctx) == ALICE_APP


@pytest.mark.parametrize("missing", ["tenant", "user_id"])
def test_storage_scope_without_a_trusted_identity_is_refused(missing: str) -> None:
    props = {"tenant": "acme", "user_id": "alice"}
    del props[missing]

    with pytest.raises(MissingIdentity) as raised:
        StorageScope.from_context(RunContext(session_id="s1", agent="travel", props=props))

    assert raised.value.missing == missing
    assert raised.value.code == "unauthenticated"


# -- search scope ----------------------------------------------------------------------------


def test_tenant_search_scope_matches_the_whole_tenant_within_the_application() -> None:
    assert ALICE.search_filter("tenant") == {"tenant": "acme", "application_id": ""}


def test_user_search_scope_matches_every_session_of_the_user() -> None:
    assert ALICE.search_filter("user") == {
        "tenant": "acme",
        "application_id": "",
        "user_id": "alice",
    }


def test_session_search_scope_matches_only_this_session_of_the_user() -> None:
    assert ALICE.search_filter("session") == {
        "tenant": "acme",
        "application_id": "",
        "user_id": "alice",
        "session_id": "s1",
    }


def test_agent_search_scope_matches_only_what_the_user_told_this_agent() -> None:
    assert ALICE.search_filter("agent") == {
        "tenant": "acme",
        "application_id": "",
        "user_id": "alice",
        "agent_id": "travel",
    }


def test_every_search_scope_stays_inside_the_callers_application() -> None:
    presets: tuple[SearchScope, ...] = ("tenant", "user", "session", "agent")
    for preset in presets:
        assert ALICE_APP.search_filter(preset)["application_id"] == "web"


def test_explicit_scope_fields_match_the_callers_values_of_those_fields() -> None:
    assert search_match(ALICE, "tenant", ["user_id", "agent_id"]) == {
        "tenant": "acme",
        "application_id": "",
        "user_id": "alice",
        "agent_id": "travel",
    }


def test_an_empty_search_scope_searches_nothing_rather_than_the_whole_tenant() -> None:
    assert search_match(ALICE, "user", []) is None


def test_without_scope_fields_the_preset_decides() -> None:
    assert search_match(ALICE, "session", None) == ALICE.search_filter("session")


@pytest.mark.parametrize("field", ["owner", "tenant_id", "user", ""])
def test_an_unknown_scope_field_is_refused_not_dropped(field: str) -> None:
    with pytest.raises(UnknownScopeField) as raised:
        search_match(ALICE, "user", ["user_id", field])

    assert raised.value.code == "unknown_scope_field"
    assert raised.value.name == field


def test_the_owner_of_memories_is_the_user_in_the_tenant_across_applications() -> None:
    assert ALICE_APP.owner() == {"tenant": "acme", "user_id": "alice"}


# -- ids and dedupe --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    [
        "I always want a window seat",
        "  I always want a window seat.\n",
        "i ALWAYS want a window  seat!",
        "I always want a window seat…",
    ],
)
def test_memory_id_is_the_same_for_the_same_fact_written_differently(variant: str) -> None:
    assert memory_id(ALICE, variant) == memory_id(ALICE, "I always want a window seat")


def test_normalising_keeps_what_changes_the_meaning() -> None:
    assert normalise("I want a window seat?") != normalise("I want a window seat")
    assert normalise("no nuts") != normalise("nuts")


def test_memory_id_is_a_uuid_both_qdrant_adapters_accept() -> None:
    assert str(uuid.UUID(memory_id(ALICE, "window seat"))) == memory_id(ALICE, "window seat")


@pytest.mark.parametrize(
    "other",
    [
        StorageScope(tenant="globex", user_id="alice", session_id="s1", agent_id="travel"),
        StorageScope(tenant="acme", user_id="bob", session_id="s1", agent_id="travel"),
        StorageScope(tenant="acme", user_id="alice", session_id="s2", agent_id="travel"),
        StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="chef"),
        ALICE_APP,
    ],
)
def test_memory_id_differs_for_another_owner_of_the_same_statement(other: StorageScope) -> None:
    assert memory_id(other, "window seat") != memory_id(ALICE, "window seat")


def test_memory_id_differs_for_another_statement() -> None:
    assert memory_id(ALICE, "window seat") != memory_id(ALICE, "aisle seat")


def test_a_record_survives_the_round_trip_through_its_payload() -> None:
    stored = record(ALICE_APP, "window seat")

    assert MemoryRecord.from_payload(stored.memory_id, dict(stored.payload())) == stored


def test_a_record_stored_before_applications_existed_belongs_to_none() -> None:
    payload: dict[str, Any] = dict(record(ALICE, "window seat").payload())
    del payload["application_id"]

    assert MemoryRecord.from_payload("id", payload).scope.application_id == ""


def test_the_same_fact_recalled_from_several_sessions_is_given_once_at_its_best_score() -> None:
    first = record(ALICE, "I always want a window seat.")
    again = record(
        StorageScope(tenant="acme", user_id="alice", session_id="s2", agent_id="travel"),
        "i always want a window seat",
    )
    other = record(ALICE, "My dog is called Rex")

    kept = distinct([(first, 0.9), (again, 0.9), (other, 0.2)], limit=5)

    assert kept == [(first, 0.9), (other, 0.2)]


def test_distinct_hits_are_cut_to_the_limit() -> None:
    found = [(record(ALICE, f"fact {n}"), 1.0 - n / 10) for n in range(5)]

    assert [r.text for r, _ in distinct(found, limit=2)] == ["fact 0", "fact 1"]


# -- what may be stored ----------------------------------------------------------------------


def test_a_store_request_makes_one_record_per_distinct_fact_under_the_callers_scope() -> None:
    records = records_to_store(
        ALICE,
        MemoryStore(texts=[" I always want a window seat. ", "My home airport is Melbourne"]),
    )

    assert [(r.text, r.scope) for r in records] == [
        ("I always want a window seat.", ALICE),
        ("My home airport is Melbourne", ALICE),
    ]


def test_the_same_fact_twice_in_one_request_is_stored_once() -> None:
    records = records_to_store(
        ALICE, MemoryStore(texts=["I always want a window seat.", "i always want a window seat"])
    )

    assert len(records) == 1


@pytest.mark.parametrize("text", [" ", "\n\t"])
def test_a_blank_text_is_refused_naming_it(text: str) -> None:
    with pytest.raises(EmptyText) as raised:
        records_to_store(ALICE, MemoryStore(texts=["fine", text]))

    assert raised.value.code == "bad_request"
    assert raised.value.details == {"field": "texts[1]"}


def test_too_many_texts_in_one_request_are_refused() -> None:
    with pytest.raises(TooManyTexts):
        records_to_store(ALICE, MemoryStore(texts=["fact"] * (MAX_TEXTS + 1)))


@pytest.mark.parametrize("source", ["chat_history", "context_provider", "compaction"])
def test_texts_that_are_not_the_users_own_words_this_run_are_refused(source: Source) -> None:
    request = MemoryStore(
        texts=["I always want a window seat", "a memory"], sources=["external", source]
    )

    with pytest.raises(NotStorable) as raised:
        records_to_store(ALICE, request)

    assert (raised.value.code, raised.value.index, raised.value.source) == (
        "not_storable",
        1,
        source,
    )


def test_external_texts_are_stored() -> None:
    request = MemoryStore(texts=["I always want a window seat"], sources=["external"])

    assert len(records_to_store(ALICE, request)) == 1


def test_sources_that_do_not_line_up_with_the_texts_are_refused() -> None:
    with pytest.raises(SourcesMismatch):
        records_to_store(ALICE, MemoryStore(texts=["a", "b"], sources=["external"]))


# -- forgetting ------------------------------------------------------------------------------


def test_forget_takes_exactly_one_way_of_saying_what() -> None:
    assert forget_selector(MemoryForget(memory_ids=["m1"])) == ("ids", ["m1"])
    assert forget_selector(MemoryForget(session_id="s1")) == ("session", "s1")
    assert forget_selector(MemoryForget(everything=True)) == ("everything", None)


@pytest.mark.parametrize(
    "request_",
    [
        MemoryForget(),
        MemoryForget(memory_ids=["m1"], everything=True),
        MemoryForget(session_id="s", everything=True),
    ],
)
def test_forget_without_exactly_one_way_is_refused(request_: MemoryForget) -> None:
    with pytest.raises(BadForget):
        forget_selector(request_)


# -- the memory_search tool ------------------------------------------------------------------


def test_the_memory_search_tool_spec_shows_the_model_only_a_query() -> None:
    assert isinstance(MEMORY_SEARCH_TOOL, ToolSpec)
    assert MEMORY_SEARCH_TOOL.name == "memory_search"
    assert set(MEMORY_SEARCH_TOOL.parameters["properties"]) == {"query"}
    assert MEMORY_SEARCH_TOOL.parameters["additionalProperties"] is False


def test_a_tool_search_looks_in_the_callers_user_scope_by_default() -> None:
    search = tool_search(ALICE, ALICE_CTX, {"query": "seat"})

    assert (search.query, search.match, search.limit, search.min_score) == (
        "seat",
        ALICE.search_filter("user"),
        5,
        None,
    )


def test_scope_arguments_the_model_invents_are_discarded() -> None:
    search = tool_search(
        ALICE,
        ALICE_CTX,
        {"query": "seat", "user_id": "bob", "tenant": "globex", "scope": "tenant", "limit": 100},
    )

    assert search.match == ALICE.search_filter("user")
    assert search.limit == 5
    assert search.discarded == ("limit", "scope", "tenant", "user_id")


def test_the_tool_scope_top_k_and_threshold_come_from_trusted_properties() -> None:
    ctx = RunContext(
        session_id="s1",
        agent="travel",
        props={
            "tenant": "acme",
            "user_id": "alice",
            "memory_scope": "user_id,agent_id",
            "memory_limit": "3",
            "memory_min_score": "0.25",
        },
    )

    search = tool_search(ALICE, ctx, {"query": "seat"})

    assert (search.match, search.limit, search.min_score) == (
        ALICE.search_filter("agent"),
        3,
        0.25,
    )


def test_a_trusted_scope_preset_is_understood() -> None:
    ctx = RunContext(props={"tenant": "acme", "user_id": "alice", "memory_scope": "session"})

    assert tool_search(ALICE, ctx, {"query": "seat"}).match == ALICE.search_filter("session")


def test_the_models_query_is_cut_to_the_tools_maximum() -> None:
    search = tool_search(ALICE, ALICE_CTX, {"query": "seat " * 1000})

    assert len(search.query) == MEMORY_SEARCH_TOOL_QUERY_MAX


@pytest.mark.parametrize("arguments", [{}, {"query": "  "}, {"query": 42}, {"q": "seat"}])
def test_a_tool_call_without_a_usable_query_gets_a_message_for_the_model(
    arguments: dict[str, Any],
) -> None:
    with pytest.raises(ValueError, match="`query` must be a non-empty string"):
        tool_search(ALICE, ALICE_CTX, arguments)


@pytest.mark.parametrize(
    ("prop", "value"),
    [
        ("memory_limit", "many"),
        ("memory_limit", "0"),
        ("memory_min_score", "nan"),
        ("memory_scope", ","),
    ],
)
def test_an_unreadable_trusted_tool_property_is_a_typed_error(prop: str, value: str) -> None:
    ctx = RunContext(props={"tenant": "acme", "user_id": "alice", prop: value})

    with pytest.raises(BadTrustedProperty) as raised:
        tool_search(ALICE, ctx, {"query": "seat"})

    assert raised.value.prop == prop


def test_a_trusted_tool_scope_naming_an_unknown_field_is_refused() -> None:
    ctx = RunContext(props={"tenant": "acme", "user_id": "alice", "memory_scope": "user_id,org"})

    with pytest.raises(UnknownScopeField):
        tool_search(ALICE, ctx, {"query": "seat"})


# -- the hashing embedder --------------------------------------------------------------------


async def test_hashing_embedder_gives_the_same_vector_every_time() -> None:
    text = "I always want a window seat"

    assert await HashingEmbedder().embed([text]) == await HashingEmbedder().embed([text])


def test_hashing_embedder_vectors_have_the_configured_size_and_unit_length() -> None:
    vectors = HashingEmbedder(dimension=64).vectors(["window seat", "a much longer sentence here"])

    for vector in vectors:
        assert len(vector) == 64
        assert math.sqrt(sum(v * v for v in vector)) == pytest.approx(1.0)


def test_hashing_embedder_puts_texts_sharing_words_closer_than_unrelated_ones() -> None:
    query, similar, unrelated = HashingEmbedder().vectors(
        ["book me a window seat", "I always want a window seat", "my dog is called Rex"]
    )

    assert cosine(query, similar) > cosine(query, unrelated) + 0.2


def test_hashing_embedder_ignores_case_and_punctuation() -> None:
    embedder = HashingEmbedder()

    assert embedder.vectors(["Window seat!"]) == embedder.vectors(["window seat"])
