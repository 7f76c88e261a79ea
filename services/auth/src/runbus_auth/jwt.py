"""The NATS JWTs of the auth callout: the server's authorization request (decoded), the user
it gets back (encoded and signed with the issuer account's nkey).

Only the claims runbus uses are modelled; the encoding is nats-io/jwt v2's: base64url JSON
header and claims, an ed25519 signature of `header.claims` by the issuer's nkey.
"""

import base64
import math
import random
import time
import uuid
from collections.abc import Callable
from typing import Final, Literal

import msgspec
import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


HEADER: Final = _b64(b'{"typ":"JWT","alg":"ed25519-nkey"}')


class ServerId(msgspec.Struct, frozen=True):
    id: str = ""
    name: str = ""


class ConnectOptions(msgspec.Struct, frozen=True):
    """What the client sent in its CONNECT; runbus clients send their bearer token."""

    auth_token: str = ""
    user: str = ""
    name: str = ""


class ClientInfo(msgspec.Struct, frozen=True):
    host: str = ""
    name: str = ""


class AuthorizationRequestData(msgspec.Struct, frozen=True):
    server_id: ServerId
    user_nkey: str
    """The key the server made for this connection: the issued user's subject."""
    connect_opts: ConnectOptions = ConnectOptions()
    client_info: ClientInfo = ClientInfo()


class AuthorizationRequest(msgspec.Struct, frozen=True):
    nats: AuthorizationRequestData


class Permission(msgspec.Struct, frozen=True, omit_defaults=True):
    allow: list[str] = []
    deny: list[str] = []


class UserPermissions(msgspec.Struct, frozen=True):
    """A NATS user's publish and subscribe allow-lists (everything else is denied)."""

    pub: Permission
    sub: Permission
    subs: int = -1
    data: int = -1
    payload: int = -1
    type: Literal["user"] = "user"
    version: int = 2


class UserClaims(msgspec.Struct, frozen=True):
    jti: str
    iat: int
    exp: int
    iss: str
    sub: str
    aud: str
    """The account the user is placed in (its name, in a server-configured deployment)."""
    name: str
    nats: UserPermissions


class AuthorizationResponseData(msgspec.Struct, frozen=True):
    jwt: str = ""
    error: str = ""
    type: Literal["authorization_response"] = "authorization_response"
    version: int = 2


class AuthorizationResponse(msgspec.Struct, frozen=True):
    jti: str
    iat: int
    iss: str
    sub: str
    aud: str
    nats: AuthorizationResponseData


_REQUEST_DECODER: Final = msgspec.json.Decoder(AuthorizationRequest)


def decode_request(token: bytes) -> AuthorizationRequest:
    """The claims of the server's request JWT. Only the server can publish on the callout
    subject of the auth account, so the claims are read, not verified against a key."""
    parts = token.strip().split(b".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    return _REQUEST_DECODER.decode(base64.urlsafe_b64decode(parts[1] + b"=" * (-len(parts[1]) % 4)))


def sign(claims: msgspec.Struct, issuer: nkeys.KeyPair) -> str:
    body = f"{HEADER}.{_b64(msgspec.json.encode(claims))}"
    return f"{body}.{_b64(issuer.sign(body.encode()))}"


def jti() -> str:
    return uuid.uuid4().hex


LIFETIME_SPREAD: Final = 0.1
"""An issued user lives between 90 % and 100 % of the TTL, drawn per connection: clients that
connected in the same second (after NATS restarted) do not all come back through the callout
in the same second every TTL, ever after."""


def lifetime(ttl: float, draw: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds one issued user lives: `ttl` shortened by up to `LIFETIME_SPREAD` of it (never
    lengthened: the TTL stays the longest a revoked token's connection lives on)."""
    return ttl * draw(1 - LIFETIME_SPREAD, 1.0)


def user_expiry(now: float, ttl: float, token_expires: float | None) -> int:
    """When a user issued at `now` expires (a JWT's `exp`, whole seconds): `ttl` seconds on,
    rounded up so it lives at least that long, and never after its token expires."""
    expires = math.ceil(now + ttl)
    return expires if token_expires is None else min(expires, int(token_expires))


def user_jwt(
    *,
    issuer: nkeys.KeyPair,
    user_nkey: str,
    account: str,
    name: str,
    permissions: UserPermissions,
    expires: int,
) -> str:
    issued = int(time.time())
    claims = UserClaims(
        jti=jti(),
        iat=issued,
        exp=expires,
        iss=issuer.public_key.decode(),
        sub=user_nkey,
        aud=account,
        name=name,
        nats=permissions,
    )
    return sign(claims, issuer)


def response(
    request: AuthorizationRequest, issuer: nkeys.KeyPair, *, user: str = "", error: str = ""
) -> bytes:
    """The signed answer to `request`: the user JWT, or the reason it is refused."""
    claims = AuthorizationResponse(
        jti=jti(),
        iat=int(time.time()),
        iss=issuer.public_key.decode(),
        sub=request.nats.user_nkey,
        aud=request.nats.server_id.id,
        nats=AuthorizationResponseData(jwt=user, error=error),
    )
    return sign(claims, issuer).encode()
