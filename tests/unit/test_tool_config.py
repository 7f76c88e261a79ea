"""A deployment's tool policy file: its middleware chain and per-tool overrides, checked at
start."""

from pathlib import Path

import pytest

from runbus.headers import RunContext
from runbus_examples.travel import tools as travel
from runbus_tool_executor.config import Deployment, ToolOverride, load_deployment
from runbus_tool_executor.errors import ToolConfigError
from runbus_tool_executor.middleware import Call, Terminate

BOOK = {"flight_id": "JQ555-20260310", "seat": "any", "cabin": "economy"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.toml"
    path.write_text(text)
    return path


def booking(arguments: dict[str, str]) -> Call:
    return Call(
        tool="create_booking", call_id="c1", arguments=arguments, run=RunContext(), side_effect=True
    )


def test_the_chain_is_built_from_factories_with_their_options(tmp_path: Path) -> None:
    deployment = load_deployment(
        write(
            tmp_path,
            """
            approval_ttl = 60
            [[middleware]]
            use = "runbus_examples.travel:corporate_policy"
            blocked = ["JQ"]
            """,
        )
    )

    assert deployment.approval_ttl == 60
    assert deployment.middleware is not None
    [policy] = deployment.middleware
    assert isinstance(policy(booking(BOOK)), Terminate)
    assert not isinstance(policy(booking({**BOOK, "flight_id": "VA823-20260310"})), Terminate)


def test_without_a_middleware_key_the_packages_chain_is_kept(tmp_path: Path) -> None:
    assert load_deployment(write(tmp_path, "approval_ttl = 30")).middleware is None
    assert load_deployment(write(tmp_path, "middleware = []")).middleware == []


def test_overrides_change_what_the_tool_declared(tmp_path: Path) -> None:
    deployment = load_deployment(
        write(
            tmp_path,
            """
            [tools.create_booking]
            approval = "always"
            timeout = 2.5
            tenants = ["acme"]
            agents = ["travel"]
            """,
        )
    )

    tool = deployment.apply(travel.tools)["create_booking"]

    assert tool.approval == "always"
    assert tool.approval_reason(BOOK) == "every create_booking call needs approval"
    assert tool.timeout == 2.5
    assert tool.tenants == frozenset({"acme"})
    assert tool.agents == frozenset({"travel"})
    assert travel.tools["create_booking"].timeout == 5.0


def test_the_default_approval_keeps_the_tools_own_rule(tmp_path: Path) -> None:
    deployment = load_deployment(write(tmp_path, "[tools.create_booking]\ntimeout = 1"))

    tool = deployment.apply(travel.tools)["create_booking"]

    assert tool.approval is travel.tools["create_booking"].approval


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("aproval_ttl = 5", "aproval_ttl"),
        ("[tools.create_booking]\napproval = 'sometimes'", "approval"),
        ("[tools.create_booking]\ntimeout = 0", "timeout"),
        ("[[middleware]]\nblocked = []", "must be 'module:factory'"),
        ("[[middleware]]\nuse = 'runbus_examples.travel:nothing'", "nothing"),
        ("[[middleware]]\nuse = 'no_such_module:x'", "no_such_module"),
        (
            "[[middleware]]\nuse = 'runbus_examples.travel:corporate_policy'\ncolour = 1",
            "colour",
        ),
        ("middleware = [", r"tools\.toml"),
    ],
    ids=[
        "unknown-key",
        "bad-approval",
        "zero-timeout",
        "no-use",
        "no-attr",
        "no-module",
        "bad-option",
        "not-toml",
    ],
)
def test_a_bad_config_stops_the_start_naming_the_problem(
    tmp_path: Path, text: str, says: str
) -> None:
    with pytest.raises(ToolConfigError, match=says):
        load_deployment(write(tmp_path, text))


def test_an_override_of_a_tool_not_served_is_refused() -> None:
    deployment = Deployment(overrides={"create_bookings": ToolOverride(timeout=1)})

    with pytest.raises(ToolConfigError, match="create_bookings"):
        deployment.apply(travel.tools)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match=r"missing\.toml"):
        load_deployment(tmp_path / "missing.toml")
