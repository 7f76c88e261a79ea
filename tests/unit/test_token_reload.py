"""The token file is followed while the services run: a token added, removed or changed is
seen at the first check after the change (one `stat` a second at most), and a version that
cannot be used keeps the last good tokens and is logged once. No bus, no sleep: the clock is
the test's."""

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from runbus.errors import Unauthenticated
from runbus.tokens import CHECK_INTERVAL, Principal, TokenFileError, TokenVerifier, WatchedTokenFile

ALICE = '[tokens.tok-alice]\nuser_id = "alice"\ntenant = "acme"\n'
BOB = '[tokens.tok-bob]\nuser_id = "bob"\ntenant = "acme"\n'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = CHECK_INTERVAL) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(ALICE + BOB)
    return path


def watching(path: Path, clock: Clock) -> TokenVerifier:
    return TokenVerifier(WatchedTokenFile(path, clock=clock).tokens)


def replace(path: Path, text: str | bytes) -> None:
    """What an operator (or a config management tool) does: write a new file, rename it over
    the old one."""
    new = path.with_name(path.name + ".new")
    if isinstance(text, bytes):
        new.write_bytes(text)
    else:
        new.write_text(text)
    os.replace(new, path)


def known(verifier: TokenVerifier, token: str) -> bool:
    try:
        verifier.verify_token(token)
    except Unauthenticated:
        return False
    return True


def test_a_token_removed_by_replacing_the_file_is_unknown_from_the_next_check(
    path: Path, clock: Clock
) -> None:
    verifier = watching(path, clock)
    assert known(verifier, "tok-bob")

    replace(path, ALICE)
    assert known(verifier, "tok-bob")  # within the interval: not looked at yet
    clock.advance()

    with pytest.raises(Unauthenticated, match="unknown token"):
        verifier.verify("Bearer tok-bob")
    assert verifier.verify("Bearer tok-alice") == Principal("alice", "acme")


def test_a_token_added_works_from_the_next_check(path: Path, clock: Clock) -> None:
    verifier = watching(path, clock)
    assert not known(verifier, "tok-carol")

    replace(path, ALICE + BOB + '[tokens.tok-carol]\nuser_id = "carol"\ntenant = "globex"\n')
    clock.advance()

    assert verifier.verify_token("tok-carol") == Principal("carol", "globex")


def test_an_edit_in_place_is_seen_too(path: Path, clock: Clock) -> None:
    verifier = watching(path, clock)

    path.write_text(BOB)  # same file, new content
    clock.advance()

    assert not known(verifier, "tok-alice")
    assert known(verifier, "tok-bob")


def test_a_token_moved_to_another_user_verifies_as_that_user(path: Path, clock: Clock) -> None:
    verifier = watching(path, clock)

    replace(path, ALICE + '[tokens.tok-bob]\nuser_id = "dave"\ntenant = "globex"\n')
    clock.advance()

    assert verifier.verify_token("tok-bob") == Principal("dave", "globex")


def test_a_kubernetes_style_swap_of_the_linked_folder_is_seen(tmp_path: Path, clock: Clock) -> None:
    # A mounted Secret or ConfigMap: tokens.toml → ..data/tokens.toml, and an update points
    # ..data at a new folder in one rename; the file's own path never changes.
    for version, text in (("v1", ALICE + BOB), ("v2", ALICE)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "tokens.toml").write_text(text)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "tokens.toml").symlink_to("..data/tokens.toml")
    verifier = watching(tmp_path / "tokens.toml", clock)
    assert known(verifier, "tok-bob")

    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.advance()

    assert not known(verifier, "tok-bob")
    assert known(verifier, "tok-alice")


def test_the_file_is_looked_at_once_per_interval_at_most(path: Path, clock: Clock) -> None:
    verifier = watching(path, clock)
    replace(path, ALICE)
    clock.advance(CHECK_INTERVAL / 2)
    assert known(verifier, "tok-bob")

    clock.advance(CHECK_INTERVAL / 2)

    assert not known(verifier, "tok-bob")


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param("[tokens.tok-alice\nuser_id = ", id="not-toml"),
        pytest.param('[tokens.tok-alice]\nuser_id = "alice"\ntenant = "a.b"\n', id="unsafe-tenant"),
        pytest.param('[tokens.tok-alice]\nuser_id = "alice"\n', id="missing-tenant"),
        pytest.param("", id="empty"),
        pytest.param(b"\xff\xfe[tokens]", id="not-utf8"),
        pytest.param(None, id="deleted"),
    ],
)
def test_a_version_that_cannot_be_used_keeps_the_last_good_tokens_and_is_logged_once(
    path: Path, clock: Clock, broken: str | bytes | None
) -> None:
    verifier = watching(path, clock)

    with capture_logs() as logs:
        if broken is None:
            path.unlink()  # e.g. between the delete and the write of a non-atomic replace
        else:
            replace(path, broken)
        clock.advance()
        still = [known(verifier, "tok-alice"), known(verifier, "tok-bob")]
        clock.advance()  # the same broken version again: nothing new to say
        known(verifier, "tok-alice")

    assert still == [True, True]
    assert [(e["event"], e["log_level"]) for e in logs] == [("token_file_reload_failed", "error")]
    assert logs[0]["path"] == str(path)
    assert logs[0]["kept_tokens"] == 2
    assert "tok-" not in repr(logs)  # a token never reaches a log

    replace(path, ALICE)  # fixed: read again
    clock.advance()
    assert not known(verifier, "tok-bob")


def test_a_reload_is_logged_with_counts_and_without_tokens(path: Path, clock: Clock) -> None:
    verifier = watching(path, clock)
    with capture_logs() as logs:
        replace(
            path,
            ALICE.replace("acme", "globex")
            + '[tokens.tok-erin]\nuser_id = "erin"\ntenant = "acme"\n',
        )
        clock.advance()
        known(verifier, "tok-erin")

    assert [(e["event"], e["log_level"]) for e in logs] == [("token_file_reloaded", "info")]
    assert {k: logs[0][k] for k in ("tokens", "added", "removed", "changed")} == {
        "tokens": 2,
        "added": 1,
        "removed": 1,
        "changed": 1,
    }
    assert "tok-" not in repr(logs)


def test_expiry_still_applies_to_a_followed_file(path: Path, clock: Clock) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    path.write_text(ALICE.replace('"acme"\n', f'"acme"\nexpires = {past}\n'))
    verifier = watching(path, clock)

    with pytest.raises(Unauthenticated, match="token expired"):
        verifier.verify_token("tok-alice")

    replace(path, ALICE.replace('"acme"\n', f'"acme"\nexpires = {future}\n'))
    clock.advance()
    assert verifier.verify_token("tok-alice").user_id == "alice"


@pytest.mark.parametrize("text", ["[tokens.t\n", '[tokens.t]\nuser_id = "a"\n'])
def test_a_file_that_cannot_be_used_at_start_still_stops_the_start(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(text)

    with pytest.raises(TokenFileError, match=r"tokens\.toml"):
        TokenVerifier.from_file(path)


def test_from_file_follows_the_file_with_the_real_clock(path: Path) -> None:
    verifier = TokenVerifier.from_file(path, check_interval=0)
    assert known(verifier, "tok-bob")

    replace(path, ALICE)

    assert not known(verifier, "tok-bob")
