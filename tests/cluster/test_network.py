"""Where the machine refuses what the cluster harness needs, it fails saying exactly which
command failed and what the system said, never skipping; what it made it removes."""

import os
from pathlib import Path

import pytest

from tests.cluster.network import PREFIX, NetnsRefused, preflight, remove_stale, sh


def test_a_refused_command_fails_naming_the_command_and_the_systems_answer() -> None:
    with pytest.raises(NetnsRefused) as refused:
        sh("ip", "link", "set", "rbj-no-such-link", "up")

    message = str(refused.value)
    assert "`ip link set rbj-no-such-link up` failed" in message
    assert "rbj-no-such-link" in refused.value.problem
    assert "root with iproute2 and iptables" in message


def test_a_run_as_another_user_fails_saying_it_is_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)

    with pytest.raises(NetnsRefused, match="running as uid 1000, not root"):
        preflight()


def test_a_machine_without_iptables_fails_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda tool: None if tool == "iptables" else tool)

    with pytest.raises(NetnsRefused, match=r"`iptables` failed: not installed"):
        preflight()


def test_leftovers_of_a_killed_run_are_removed_and_a_live_runs_are_not(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}999999999-gone"
    alive = tmp_path / f"{PREFIX}{os.getpid()}-mine"
    dead.mkdir()
    alive.mkdir()

    removed = remove_stale(tmp_path)

    assert str(dead) in removed
    assert not dead.exists()
    assert alive.exists()
