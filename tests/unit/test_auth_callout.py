"""The auth callout's pure parts: what a user may do on the bus, the JWTs it signs and how long
the users it issues live."""

import base64
import json
import random
from pathlib import Path

import nkeys

from runbus import busauth
from runbus.settings import load_settings
from runbus.tokens import Principal, token_digest
from runbus_auth import jwt
from runbus_auth.permissions import client_permissions
from runbus_auth.service import AuthService

SEED = nkeys.encode_seed(bytes(32), nkeys.PREFIX_BYTE_ACCOUNT)
ISSUER = nkeys.from_seed(bytearray(SEED))


def _claims(token: str) -> dict[str, object]:
    body = token.split(".")[1]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return decoded


def test_a_user_may_publish_runs_api_calls_whoami_and_consumers_of_their_own_events_only() -> None:
    digest = token_digest("dev-alice")

    allowed = client_permissions(Principal("alice", "acme"), digest)

    assert allowed.pub.allow == [
        "runbus.runs.>",
        "runbus.api.>",
        "runbus.auth.whoami",
        "JS.RUNBUS.API.CONSUMER.CREATE.RUNBUS_EVENTS.*.runbus.events.acme.alice.>",
        "$JS.FC.RUNBUS_EVENTS.>",
    ]
    assert allowed.sub.allow == [f"_INBOX.{digest}.>"]
    assert allowed.pub.deny == allowed.sub.deny == []


def test_two_tokens_of_one_user_get_inboxes_of_their_own() -> None:
    one = client_permissions(Principal("alice", "acme"), token_digest("token-1"))
    two = client_permissions(Principal("alice", "acme"), token_digest("token-2"))

    assert one.sub.allow[0] != two.sub.allow[0]
    assert "token-1" not in one.sub.allow[0]


def test_the_user_jwt_is_signed_by_the_issuer_and_names_account_user_and_expiry() -> None:
    permissions = client_permissions(Principal("alice", "acme"), token_digest("dev-alice"))

    token = jwt.user_jwt(
        issuer=ISSUER,
        user_nkey="UABC",
        account=busauth.CLIENT_ACCOUNT,
        name="acme/alice",
        permissions=permissions,
        expires=2_000_000_000,
    )
    header, body, signature = token.split(".")

    assert ISSUER.verify(f"{header}.{body}".encode(), base64.urlsafe_b64decode(signature + "=="))
    claims = _claims(token)
    assert claims["aud"] == "CLIENTS"
    assert claims["sub"] == "UABC"
    assert claims["iss"] == ISSUER.public_key.decode()
    assert claims["exp"] == 2_000_000_000
    nats = claims["nats"]
    assert isinstance(nats, dict)
    assert nats["type"] == "user"
    assert nats["version"] == 2


def test_a_refusal_carries_the_reason_and_a_version_2_response() -> None:
    request = jwt.AuthorizationRequest(
        nats=jwt.AuthorizationRequestData(server_id=jwt.ServerId(id="NSERVER"), user_nkey="UABC")
    )

    claims = _claims(jwt.response(request, ISSUER, error="unknown token").decode())

    assert claims["aud"] == "NSERVER"
    assert claims["sub"] == "UABC"
    assert claims["nats"] == {
        "jwt": "",
        "error": "unknown token",
        "type": "authorization_response",
        "version": 2,
    }


def test_the_servers_request_is_read_for_its_token_and_keys() -> None:
    body = {
        "nats": {
            "server_id": {"id": "NSERVER", "name": "n1"},
            "user_nkey": "UABC",
            "connect_opts": {"auth_token": "dev-alice", "name": "cli"},
            "client_info": {"host": "127.0.0.1"},
            "type": "authorization_request",
            "version": 2,
        }
    }
    payload = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=")

    request = jwt.decode_request(b"eyJ0eXAiOiJKV1QifQ." + payload + b".c2ln")

    assert request.nats.connect_opts.auth_token == "dev-alice"
    assert request.nats.user_nkey == "UABC"
    assert request.nats.server_id.id == "NSERVER"


def test_an_issued_user_lives_the_credential_ttl_at_least_and_never_past_its_token() -> None:
    # Whole seconds, rounded up: a user issued at 100.2 with a TTL of 2 lives until 103.
    assert jwt.user_expiry(100.2, 2, None) == 103
    assert jwt.user_expiry(100.0, 300, None) == 400
    assert jwt.user_expiry(100.0, 300, 250.0) == 250


def test_issued_users_live_between_nine_tenths_of_the_ttl_and_the_ttl_spread_apart() -> None:
    draw = random.Random(7).uniform
    lifetimes = [jwt.lifetime(300, draw) for _ in range(200)]

    assert all(270 <= t <= 300 for t in lifetimes)
    assert max(lifetimes) - min(lifetimes) > 20  # spread, not all in the same second


def test_the_credential_ttl_setting_reaches_the_callout(tmp_path: Path) -> None:
    settings = load_settings(
        {"RUNBUS_CLIENT_CREDENTIAL_TTL": "42", "RUNBUS_DATA_DIR": str(tmp_path)}
    )

    auth = AuthService.from_settings(None, settings, None)  # type: ignore[arg-type]

    assert auth.credential_ttl == 42
    assert AuthService(None, verifier=auth.verifier, issuer_seed=SEED).credential_ttl == 300  # type: ignore[arg-type]
