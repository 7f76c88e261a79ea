"""The auth service: answers nats-server's auth callout for every client connection (bearer
token → a NATS user with that owner's permissions, or a refusal), `runbus.auth.whoami`, and
the clients' consumer creations (forwarded to JetStream when they deliver into their own inbox)."""

import secrets
import time
from pathlib import Path
from typing import Final, Self

import nats.errors
import nkeys
import structlog
from nats.aio.client import Client as NATS
from nats.micro.request import Request
from opentelemetry.sdk.trace import TracerProvider

from runbus import busauth, ops, subjects
from runbus.errors import Unauthenticated
from runbus.headers import RunContext
from runbus.messages.auth import Identity, WhoAmI
from runbus.service import DEFAULT_OPTIONS, Endpoint, Service, ServiceOptions
from runbus.settings import Settings, SettingsError
from runbus.tokens import TokenVerifier, token_digest

from . import consumers, jwt
from .permissions import client_permissions

CREDENTIAL_TTL: Final = Settings().client_credential_ttl
"""Seconds an issued NATS user lives (`RUNBUS_CLIENT_CREDENTIAL_TTL`); the server then
disconnects the client, which connects again through the callout: so a removed or expired
token loses its open connections within this time."""


def _issuer_seed(settings: Settings) -> bytes:
    """The issuer seed RUNBUS_AUTH_ISSUER_SEED_FILE names (it must exist), else the one
    `runbus up` generated under the data dir, else a key of this process only: on a bus
    without the callout (open, or an external one) only whoami is asked of this service."""
    if settings.auth_issuer_seed_file:
        try:
            return Path(settings.auth_issuer_seed_file).read_bytes().strip()
        except OSError as exc:
            raise SettingsError("RUNBUS_AUTH_ISSUER_SEED_FILE", str(exc)) from None
    generated = busauth.secrets_dir(settings.data_path) / busauth.ISSUER_SEED_FILE
    if generated.exists():
        return generated.read_bytes().strip()
    structlog.get_logger().warning("auth_issuer_key_of_this_process_only", looked_in=str(generated))
    seed: bytes = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_ACCOUNT)
    return seed


class AuthService(Service):
    name = "auth"
    description = "Auth callout: bearer token → NATS user with that owner's permissions"

    def __init__(
        self,
        nc: NATS,
        *,
        verifier: TokenVerifier,
        issuer_seed: bytes,
        account: str = busauth.CLIENT_ACCOUNT,
        credential_ttl: float = CREDENTIAL_TTL,
        options: ServiceOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(nc, options=options)
        self.verifier = verifier
        self.issuer = nkeys.from_seed(bytearray(issuer_seed))
        self.account = account
        self.credential_ttl = credential_ttl

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(
            nc,
            verifier=TokenVerifier.from_file(
                Path(settings.tokens_file) if settings.tokens_file else None
            ),
            issuer_seed=_issuer_seed(settings),
            credential_ttl=settings.client_credential_ttl,
            options=ServiceOptions(tracer_provider=tracer_provider),
        )

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint.for_op(ops.AUTH_WHOAMI, self.on_whoami)]

    async def on_listening(self) -> None:
        # The callout body is a JWT, not a runbus request: an endpoint that answers it itself.
        await self.listen_raw("callout", subjects.AUTH_CALLOUT, self.on_authorize)
        await self.listen_raw("consumer_create", subjects.CONSUMER_CHECKS, self.on_consumer_create)

    async def on_whoami(self, ctx: RunContext, request: WhoAmI) -> Identity:
        principal = self.verifier.verify(ctx.auth)
        _, _, token = ctx.auth.partition(" ")
        return Identity(
            tenant=principal.tenant,
            user_id=principal.user_id,
            inbox_prefix=subjects.client_inbox_prefix(token_digest(token.strip())),
        )

    async def on_consumer_create(self, msg: Request) -> str | None:
        """A client's consumer of its events: forwarded to JetStream when it delivers into the
        client's own inbox, refused otherwise (returned, as the error `$SRV.STATS` counts)."""
        reason = consumers.refusal(msg.subject, msg.data, self.verifier.holder)
        if reason is not None:
            self.log.warning("consumer_refused", subject=msg.subject[:300], reason=reason)
            await msg.respond(consumers.refused(reason))
            return f"forbidden: {reason}"
        try:
            reply = await self.nc.request(
                consumers.forwarded(msg.subject), msg.data, timeout=self.options.request_timeout
            )
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
            await msg.respond(consumers.unavailable(f"JetStream did not answer: {exc}"))
            return f"unavailable: {exc}"
        await msg.respond(reply.data)
        return None

    async def on_authorize(self, msg: Request) -> str | None:
        """One connection attempt: always answered, with a user or with the reason why not
        (returned, as the error `$SRV.STATS` counts)."""
        try:
            request = jwt.decode_request(msg.data)
        except ValueError as exc:
            # Not the server's request (nothing else can publish here); nothing to answer.
            self.log.warning("auth_request_unreadable", error=str(exc))
            return f"unreadable: {exc}"
        token = request.nats.connect_opts.auth_token
        client = request.nats.client_info
        try:
            if not token:
                raise Unauthenticated("no token")
            principal = self.verifier.verify_token(token)
        except Unauthenticated as exc:
            self.log.info(
                "connection_refused", reason=exc.message, host=client.host, client=client.name
            )
            await msg.respond(jwt.response(request, self.issuer, error=exc.message))
            return f"{exc.code}: {exc.message}"
        user = jwt.user_jwt(
            issuer=self.issuer,
            user_nkey=request.nats.user_nkey,
            account=self.account,
            name=f"{principal.tenant}/{principal.user_id}",
            permissions=client_permissions(principal, token_digest(token)),
            expires=jwt.user_expiry(
                time.time(), jwt.lifetime(self.credential_ttl), principal.expires
            ),
        )
        self.log.info(
            "connection_authorized",
            tenant=principal.tenant,
            user_id=principal.user_id,
            host=client.host,
        )
        await msg.respond(jwt.response(request, self.issuer, user=user))
        return None
