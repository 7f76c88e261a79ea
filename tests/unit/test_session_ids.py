"""Session ids an ingress derives from fields any client fills are scoped to the caller."""

from runbus import session_ids
from runbus.messages import is_identifier


def test_the_same_name_is_another_session_for_each_user_and_tenant() -> None:
    alice = session_ids.scoped("acme", "alice", "trip")
    bob = session_ids.scoped("acme", "bob", "trip")
    carol = session_ids.scoped("globex", "alice", "trip")

    assert len({alice, bob, carol, "trip"}) == 4
    assert session_ids.scoped("acme", "alice", "trip") == alice


def test_an_id_sent_back_by_its_own_user_names_the_same_session() -> None:
    alice = session_ids.scoped("acme", "alice", "trip")

    assert session_ids.scoped("acme", "alice", alice) == alice
    assert session_ids.scoped("acme", "bob", alice) != alice
    assert session_ids.unscoped(alice) == "trip"
    assert session_ids.scoped("acme", "alice", session_ids.unscoped(alice)) == alice


def test_only_another_user_s_scoped_id_is_foreign() -> None:
    alice = session_ids.scoped("acme", "alice", "trip")

    assert session_ids.foreign(alice, "acme", "bob")
    assert session_ids.foreign(alice, "globex", "alice")
    assert not session_ids.foreign(alice, "acme", "alice")
    assert not session_ids.foreign("trip", "acme", "bob")


def test_a_name_that_cannot_be_a_session_id_becomes_its_digest() -> None:
    for given in ("alice@example.com", "x" * 128, "ü"):
        scoped = session_ids.scoped("acme", "alice", given)

        assert is_identifier(scoped)
        assert session_ids.scoped("acme", "alice", given) == scoped
        assert session_ids.scoped("acme", "alice", session_ids.unscoped(scoped)) == scoped
