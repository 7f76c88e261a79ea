"""Who is calling: a bearer token → principal (user_id, tenant). Client-sent identity is
never trusted; this is the only place a principal comes from."""

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import msgspec

from runbus.errors import Unauthenticated
from runbus.messages import Identifier

from .errors import GatewayConfigError

Token = Identifier
"""Tokens, user ids and tenants are subject-safe: a tenant becomes a history subject token."""


@dataclass(frozen=True)
class Principal:
    user_id: str
    tenant: str


class TokenEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    user_id: Token
    tenant: Token


class TokenFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tokens: dict[str, TokenEntry]


class TokenVerifier:
    """Verifies `Bearer <token>` against a TOML file of tokens (dev tokens by default)."""

    def __init__(self, tokens: dict[str, Principal]) -> None:
        self._tokens = tokens

    @classmethod
    def from_file(cls, path: Path | None = None) -> "TokenVerifier":
        text = (
            path.read_text()
            if path is not None
            else resources.files(__package__).joinpath("dev_tokens.toml").read_text()
        )
        try:
            parsed = msgspec.convert(tomllib.loads(text), TokenFile)
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise GatewayConfigError(
                f"token file {str(path or 'dev_tokens.toml')!r}: {exc}"
            ) from None
        return cls({t: Principal(e.user_id, e.tenant) for t, e in parsed.tokens.items()})

    def verify(self, header: str | None) -> Principal:
        if not header:
            raise Unauthenticated("missing rb-auth header (expected `Bearer <token>`)")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("rb-auth must be `Bearer <token>`")
        principal = self._tokens.get(token.strip())
        if principal is None:
            raise Unauthenticated("unknown token")
        return principal
