import hashlib

import msgspec

from runbus.headers import RunContext
from runbus.owners import Owner, digest, token
from runbus_gateway.approvals import approval_key


def test_owner_is_read_from_the_trusted_properties_of_a_run() -> None:
    ctx = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})
    assert Owner.of(ctx) == Owner("acme", "alice")
    assert Owner.of(RunContext()) == Owner("", "")


def test_an_owner_is_identified_only_when_both_halves_are_identifiers() -> None:
    assert Owner("acme", "alice").identified
    assert not Owner("", "alice").identified
    assert not Owner("acme", "al.ice").identified


def test_owner_keys_put_the_tenant_and_user_before_the_ids() -> None:
    alice = Owner("acme", "alice")
    assert alice.key("r-1") == "acme.alice.r-1"
    assert alice.key("r-1", "*") == "acme.alice.r-1.*"
    assert alice.key("*") == "acme.alice.*"
    assert alice.user_key("r-1") == "alice.r-1"


def test_two_owners_never_share_a_key_for_the_same_run_id() -> None:
    assert Owner("acme", "alice").key("r-1") != Owner("acme", "bob").key("r-1")
    assert Owner("acme", "alice").key("r-1") != Owner("globex", "alice").key("r-1")


def test_safe_keys_hash_every_token_that_is_no_identifier_and_keep_the_rest() -> None:
    key = Owner("acme", "al ice").safe_key("r-1", "call.id with * and >")
    tenant, user, run, call = key.split(".")
    assert (tenant, run) == ("acme", "r-1")
    assert user == "h-" + digest("al ice")
    assert call == "h-" + digest("call.id with * and >")
    assert token("r-1") == "r-1"


def test_an_owner_is_stored_as_its_two_named_fields() -> None:
    stored = b'{"tenant":"acme","user_id":"alice"}'
    assert msgspec.json.encode(Owner("acme", "alice")) == stored
    assert msgspec.json.decode(stored, type=Owner) == Owner("acme", "alice")


def test_approval_keys_stay_those_of_the_approvals_already_stored() -> None:
    call_digest = hashlib.sha256(b"call 1").hexdigest()[:32]

    key = approval_key(Owner("acme", "alice"), "r-1", "call 1")

    assert key == f"acme.alice.r-1.{call_digest}"
