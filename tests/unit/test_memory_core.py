"""Memory rules without a bus or a store: scopes, ids, records and the hashing embedder."""

import math
import uuid
from datetime import UTC, datetime

import pytest

from runbus.headers import RunContext
from runbus_memory.core import MemoryRecord, StorageScope, memory_id
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.errors import MissingIdentity

ALICE = StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="travel")


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_storage_scope_comes_from_trusted_properties_session_and_agent() -> None:
    ctx = RunContext(session_id="s1", agent="travel", props={"tenant": "acme", "user_id": "alice"})

    assert StorageScope.from_context(ctx) == ALICE


@pytest.mark.parametrize("missing", ["tenant", "user_id"])
def test_storage_scope_without_a_trusted_identity_is_refused(missing: str) -> None:
    props = {"tenant": "acme", "user_id": "alice"}
    del props[missing]

    with pytest.raises(MissingIdentity) as raised:
        StorageScope.from_context(RunContext(session_id="s1", agent="travel", props=props))

    assert raised.value.missing == missing


def test_tenant_search_scope_matches_the_whole_tenant() -> None:
    assert ALICE.search_filter("tenant") == {"tenant": "acme"}


def test_user_search_scope_matches_every_session_of_the_user() -> None:
    assert ALICE.search_filter("user") == {"tenant": "acme", "user_id": "alice"}


def test_session_search_scope_matches_only_this_session_of_the_user() -> None:
    assert ALICE.search_filter("session") == {
        "tenant": "acme",
        "user_id": "alice",
        "session_id": "s1",
    }


def test_agent_search_scope_matches_only_what_the_user_told_this_agent() -> None:
    assert ALICE.search_filter("agent") == {
        "tenant": "acme",
        "user_id": "alice",
        "agent_id": "travel",
    }


def test_memory_id_is_the_same_for_the_same_owner_and_statement() -> None:
    assert memory_id(ALICE, "window seat") == memory_id(ALICE, "  window seat\n")


def test_memory_id_is_a_uuid_both_qdrant_adapters_accept() -> None:
    assert str(uuid.UUID(memory_id(ALICE, "window seat"))) == memory_id(ALICE, "window seat")


@pytest.mark.parametrize(
    "other",
    [
        StorageScope(tenant="globex", user_id="alice", session_id="s1", agent_id="travel"),
        StorageScope(tenant="acme", user_id="bob", session_id="s1", agent_id="travel"),
        StorageScope(tenant="acme", user_id="alice", session_id="s2", agent_id="travel"),
        StorageScope(tenant="acme", user_id="alice", session_id="s1", agent_id="chef"),
    ],
)
def test_memory_id_differs_for_another_owner_of_the_same_statement(other: StorageScope) -> None:
    assert memory_id(other, "window seat") != memory_id(ALICE, "window seat")


def test_memory_id_differs_for_another_statement() -> None:
    assert memory_id(ALICE, "window seat") != memory_id(ALICE, "aisle seat")


def test_a_record_survives_the_round_trip_through_its_payload() -> None:
    record = MemoryRecord(
        memory_id=memory_id(ALICE, "window seat"),
        text="window seat",
        scope=ALICE,
        created_at=datetime(2025, 3, 1, 12, 30, tzinfo=UTC),
    )

    assert MemoryRecord.from_payload(record.memory_id, dict(record.payload())) == record


def test_hashing_embedder_gives_the_same_vector_every_time() -> None:
    text = "I always want a window seat"

    assert HashingEmbedder().embed([text]) == HashingEmbedder().embed([text])


def test_hashing_embedder_vectors_have_the_configured_size_and_unit_length() -> None:
    vectors = HashingEmbedder(dimension=64).embed(["window seat", "a much longer sentence here"])

    for vector in vectors:
        assert len(vector) == 64
        assert math.sqrt(sum(v * v for v in vector)) == pytest.approx(1.0)


def test_hashing_embedder_puts_texts_sharing_words_closer_than_unrelated_ones() -> None:
    query, similar, unrelated = HashingEmbedder().embed(
        ["book me a window seat", "I always want a window seat", "my dog is called Rex"]
    )

    assert cosine(query, similar) > cosine(query, unrelated) + 0.2


def test_hashing_embedder_ignores_case_and_punctuation() -> None:
    embedder = HashingEmbedder()

    assert embedder.embed(["Window seat!"]) == embedder.embed(["window seat"])
