"""The embedded nats-server runs with one Go thread unless the environment says otherwise
(docs/operations.md#scaling): read from the started process's own environment."""

from pathlib import Path

import pytest

from runbus.embedded import EmbeddedNats


def server_environment(tmp_path: Path) -> dict[str, str]:
    with EmbeddedNats(tmp_path / "js") as server:
        raw = Path(f"/proc/{server.pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_the_embedded_server_runs_one_go_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    assert server_environment(tmp_path)["GOMAXPROCS"] == "1"


def test_gomaxprocs_from_the_environment_is_passed_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOMAXPROCS", "4")
    assert server_environment(tmp_path)["GOMAXPROCS"] == "4"
