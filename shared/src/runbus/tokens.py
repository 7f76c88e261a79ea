"""Who is calling: a bearer token → principal (user_id, tenant). Client-sent identity is
never trusted; the gateway (per request) and the auth callout (per NATS connection) both
take a principal only from here.

A token file is read again when it changes, so adding, removing or rotating a token takes
effect without a restart (`WatchedTokenFile`)."""

import hashlib
import os
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Final

import msgspec
import structlog

from .errors import RunbusError, Unauthenticated
from .messages import Identifier

Token = Identifier
"""Tokens, user ids and tenants are subject-safe: a tenant becomes a subject token."""

CHECK_INTERVAL: Final = 1.0
"""Seconds between two looks at whether the token file changed (one `stat` each)."""


class TokenFileError(RunbusError):
    """The token file cannot be read or holds an entry that is not subject-safe."""


@dataclass(frozen=True)
class Principal:
    user_id: str
    tenant: str
    expires: float | None = None
    """When the token stops being valid (seconds since the epoch), if it ever does."""


class TokenEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    user_id: Token
    tenant: Token
    expires: datetime | None = None
    """When the token stops being valid (a TOML date-time with an offset)."""


class TokenFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokens: dict[str, TokenEntry]


def token_digest(token: str) -> str:
    """A subject-safe name for one credential (its inbox prefix), from which the token
    cannot be recovered."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def run_msg_id(token: str, run_id: str) -> str:
    """`Nats-Msg-Id` of a run request sent with `token`. JetStream drops a re-publish of a key
    it saw within its duplicate window, whoever sends it; this key also names the credential,
    which nobody else can know: a retry of the sender's own request is dropped, and another
    user publishing the same run id first never makes this request a dropped duplicate."""
    return f"{run_id}.{token_digest(token)}"


def msg_run_id(msg_id: str) -> str:
    """The run id a run request's `Nats-Msg-Id` names."""
    return msg_id.partition(".")[0]


def is_run_msg_id(msg_id: str, auth: str | None, run_id: str) -> bool:
    """Whether `msg_id` is a dedupe key of `run_id` sent with the `rb-auth` value `auth`: the
    credential's own (`run_msg_id`), or the bare run id (a hand-made publish: another user
    who publishes that bare id first within the window takes it)."""
    _, _, token = (auth or "").partition(" ")
    return msg_id == run_id or msg_id == run_msg_id(token.strip(), run_id)


def parse_tokens(text: str, name: str) -> dict[str, Principal]:
    """The principals of a token file's text; `name` says which file in the error."""
    try:
        parsed = msgspec.convert(tomllib.loads(text), TokenFile)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        # Neither message quotes a token: msgspec writes a table's key as `[...]`.
        raise TokenFileError(f"token file {name!r}: {exc}") from None
    return {
        token: Principal(
            entry.user_id,
            entry.tenant,
            entry.expires.timestamp() if entry.expires is not None else None,
        )
        for token, entry in parsed.tokens.items()
    }


def read_tokens(path: Path) -> dict[str, Principal]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"token file {str(path)!r}: {exc}") from None
    return parse_tokens(text, str(path))


FileStamp = tuple[int, int, int, int, int]
"""What tells one version of a file from another without reading it: device, inode, size,
and modification and change times in nanoseconds. A rename over the file changes the inode,
an edit in place the size or the times."""


def file_stamp(path: Path) -> FileStamp | None:
    """The stamp of the file at `path` (through symlinks, so a Kubernetes volume's swap of
    its `..data` link counts), or None when there is none to read right now."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class WatchedTokenFile:
    """The tokens of one file, read again when the file changes.

    Checked when a token is verified, at most once per `check_interval`: one `stat`, and a
    read only when the file's stamp moved. A background watcher was the other way; this one
    needs no task to start and stop in either service, costs nothing while nobody connects
    or calls, and cannot fall behind the verification it serves. The file is small and read
    rarely, so reading it on the event loop is cheaper than a thread hop.

    A version that cannot be used (unreadable, not TOML, a bad entry, or no file at all for
    a moment while it is being replaced) keeps the tokens of the last good one and is logged
    once; the next change is read again. The first version, at start, must be good.
    """

    def __init__(
        self,
        path: Path,
        *,
        check_interval: float = CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.check_interval = check_interval
        self._clock = clock
        # Stamped before it is read: a change made while reading moves the stamp again, so
        # the next check reads the file once more instead of keeping a half-written version.
        self._stamp = file_stamp(path)
        self._tokens = read_tokens(path)
        self._checked = clock()

    def tokens(self) -> Mapping[str, Principal]:
        """The tokens of the file's newest good version (as of at most `check_interval`
        ago)."""
        now = self._clock()
        if now - self._checked >= self.check_interval:
            self._checked = now
            stamp = file_stamp(self.path)
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self._tokens

    def _reload(self) -> None:
        log = structlog.get_logger()
        try:
            tokens = read_tokens(self.path)
        except TokenFileError as exc:
            log.error(
                "token_file_reload_failed",
                path=str(self.path),
                error=exc.message,
                kept_tokens=len(self._tokens),
            )
            return
        old = self._tokens
        self._tokens = tokens
        log.info(
            "token_file_reloaded",
            path=str(self.path),
            tokens=len(tokens),
            added=len(tokens.keys() - old.keys()),
            removed=len(old.keys() - tokens.keys()),
            changed=sum(1 for t in tokens.keys() & old.keys() if tokens[t] != old[t]),
        )


class TokenVerifier:
    """Verifies `Bearer <token>` against a TOML file of tokens (dev tokens by default)."""

    def __init__(
        self, tokens: Mapping[str, Principal] | Callable[[], Mapping[str, Principal]]
    ) -> None:
        """`tokens`: fixed ones, or a function that gives the current ones at each check."""
        self._tokens = tokens if callable(tokens) else lambda: tokens
        # The digests of one version of the tokens, made again when they change.
        self._digests: tuple[Mapping[str, Principal], dict[str, str]] | None = None

    @classmethod
    def from_file(
        cls, path: Path | None = None, *, check_interval: float = CHECK_INTERVAL
    ) -> "TokenVerifier":
        """The tokens of `path`, followed as the file changes; without a path, the packaged
        dev tokens (which never change)."""
        if path is None:
            text = resources.files(__package__).joinpath("dev_tokens.toml").read_text()
            return cls(parse_tokens(text, "dev_tokens.toml"))
        return cls(WatchedTokenFile(path, check_interval=check_interval).tokens)

    def verify(self, header: str | None) -> Principal:
        """The principal of an `rb-auth` header value (`Bearer <token>`)."""
        if not header:
            raise Unauthenticated("missing rb-auth header (expected `Bearer <token>`)")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("rb-auth must be `Bearer <token>`")
        return self.verify_token(token)

    def holder(self, digest: str) -> Principal | None:
        """The principal of the valid token whose `token_digest` is `digest` (whose inbox
        prefix it names), if there is one."""
        tokens = self._tokens()
        if self._digests is None or self._digests[0] is not tokens:
            self._digests = (tokens, {token_digest(token): token for token in tokens})
        token = self._digests[1].get(digest)
        if token is None:
            return None
        try:
            return self.verify_token(token)
        except Unauthenticated:
            return None

    def verify_token(self, token: str) -> Principal:
        """The principal of a bare token (as a NATS connection presents it)."""
        principal = self._tokens().get(token.strip())
        if principal is None:
            raise Unauthenticated("unknown token")
        if principal.expires is not None and principal.expires <= time.time():
            raise Unauthenticated("token expired")
        return principal
