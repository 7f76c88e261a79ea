"""Who is calling: a bearer token → principal (user_id, tenant). Client-sent identity is
never trusted; the gateway (per request) and the auth callout (per NATS connection) both
take a principal only from here."""

import hashlib
import time
import tomllib
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path

import msgspec

from .errors import RunbusError, Unauthenticated
from .messages import Identifier

Token = Identifier
"""Tokens, user ids and tenants are subject-safe: a tenant becomes a subject token."""


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


class TokenVerifier:
    """Verifies `Bearer <token>` against a TOML file of tokens (dev tokens by default)."""

    def __init__(self, tokens: dict[str, Principal]) -> None:
        self._tokens = tokens

    @classmethod
    def from_file(cls, path: Path | None = None) -> "TokenVerifier":
        try:
            text = (
                path.read_text()
                if path is not None
                else resources.files(__package__).joinpath("dev_tokens.toml").read_text()
            )
            parsed = msgspec.convert(tomllib.loads(text), TokenFile)
        except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise TokenFileError(f"token file {str(path or 'dev_tokens.toml')!r}: {exc}") from None
        return cls(
            {
                token: Principal(
                    entry.user_id,
                    entry.tenant,
                    entry.expires.timestamp() if entry.expires is not None else None,
                )
                for token, entry in parsed.tokens.items()
            }
        )

    def verify(self, header: str | None) -> Principal:
        """The principal of an `rb-auth` header value (`Bearer <token>`)."""
        if not header:
            raise Unauthenticated("missing rb-auth header (expected `Bearer <token>`)")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("rb-auth must be `Bearer <token>`")
        return self.verify_token(token)

    def verify_token(self, token: str) -> Principal:
        """The principal of a bare token (as a NATS connection presents it)."""
        principal = self._tokens.get(token.strip())
        if principal is None:
            raise Unauthenticated("unknown token")
        if principal.expires is not None and principal.expires <= time.time():
            raise Unauthenticated("token expired")
        return principal
