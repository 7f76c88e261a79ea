"""Gateway configuration: agent definitions and the token verifier."""

from pathlib import Path

import pytest

from runbus.errors import Unauthenticated
from runbus.tokens import Principal, TokenFileError, TokenVerifier
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from runbus_gateway.errors import GatewayConfigError

AGENT = """
name = "{name}"
instructions = "Help."
model = "offline"
"""


def test_the_packaged_travel_agent_is_loaded_by_default() -> None:
    agents = load_agents(AGENTS_DIR)

    travel = agents["travel"]
    assert travel.model == "offline"
    assert travel.tools == ["get_weather", "search_flights", "create_booking"]
    assert travel.memory.enabled
    assert travel.memory.store_user_statements
    assert travel.instructions.strip().startswith("You are a travel assistant.")


def test_agents_are_loaded_from_a_folder_by_name_with_defaults(tmp_path: Path) -> None:
    (tmp_path / "helper.toml").write_text(AGENT.format(name="helper"))
    (tmp_path / "notes.txt").write_text("not an agent")

    agents = load_agents(tmp_path)

    assert list(agents) == ["helper"]
    helper = agents["helper"]
    assert helper.tools == []
    assert helper.max_iterations == 40
    assert helper.concurrency == "reject"
    assert not helper.memory.enabled
    assert helper.compaction.max_tokens is None


def test_an_agent_file_that_is_not_toml_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text("name = \n")

    with pytest.raises(GatewayConfigError, match=r"broken\.toml"):
        load_agents(tmp_path)


def test_an_agent_file_with_an_unknown_key_is_refused_naming_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "typo.toml").write_text(AGENT.format(name="typo") + "max_iteration = 3\n")

    with pytest.raises(GatewayConfigError, match=r"typo\.toml") as raised:
        load_agents(tmp_path)

    assert "max_iteration" in str(raised.value)


def test_an_unknown_key_in_a_nested_policy_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mem.toml").write_text(AGENT.format(name="mem") + "[memory]\nenable = true\n")

    with pytest.raises(GatewayConfigError, match="enable"):
        load_agents(tmp_path)


@pytest.mark.parametrize("name", ["a.b", "x>", "has space", "travel\\n"])
def test_an_agent_name_unsafe_in_a_subject_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "bad.toml").write_text(AGENT.format(name=name))

    with pytest.raises(GatewayConfigError, match=r"bad\.toml"):
        load_agents(tmp_path)


def test_two_files_defining_the_same_agent_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(AGENT.format(name="twin"))
    (tmp_path / "b.toml").write_text(AGENT.format(name="twin"))

    with pytest.raises(GatewayConfigError, match="'twin'"):
        load_agents(tmp_path)


@pytest.mark.parametrize(
    ("header", "principal"),
    [
        ("Bearer dev-alice", Principal("alice", "acme")),
        ("Bearer dev-bob", Principal("bob", "acme")),
        ("Bearer dev-carol", Principal("carol", "globex")),
        ("bearer dev-carol", Principal("carol", "globex")),
    ],
)
def test_dev_tokens_map_to_their_users_and_tenants(header: str, principal: Principal) -> None:
    assert TokenVerifier.from_file().verify(header) == principal


@pytest.mark.parametrize(
    "header",
    [None, "", "dev-alice", "Basic dev-alice", "Bearer", "Bearer ", "Bearer dev-mallory"],
)
def test_a_missing_malformed_or_unknown_credential_is_unauthenticated(
    header: str | None,
) -> None:
    with pytest.raises(Unauthenticated) as raised:
        TokenVerifier.from_file().verify(header)

    assert raised.value.code == "unauthenticated"


def test_a_token_file_of_your_own_replaces_the_dev_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens.s3cret]\nuser_id = "dana"\ntenant = "initech"\n')

    verifier = TokenVerifier.from_file(path)

    assert verifier.verify("Bearer s3cret") == Principal("dana", "initech")
    with pytest.raises(Unauthenticated):
        verifier.verify("Bearer dev-alice")


@pytest.mark.parametrize("tenant", ["a.b", "acme\\n"])
def test_a_token_file_with_an_unsafe_tenant_is_refused_naming_the_file(
    tmp_path: Path, tenant: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens.t1]\nuser_id = "dana"\ntenant = "{tenant}"\n')

    with pytest.raises(TokenFileError, match=r"tokens\.toml"):
        TokenVerifier.from_file(path)
