"""Who a run, call or session belongs to (tenant and user), and the keys built from it: anything
stored or addressed per run is keyed by its owner too, so another owner's ids never reach it."""

import hashlib
from typing import Self

import msgspec

from .headers import RunContext
from .messages import is_identifier


class Owner(msgspec.Struct, frozen=True):
    """A run's owner, as the gateway authenticated it (`rb-prop-tenant`, `rb-prop-user_id`).

    Stored as `{"tenant": …, "user_id": …}` (the run owners bucket holds exactly that).
    """

    tenant: str
    user_id: str

    @classmethod
    def of(cls, ctx: RunContext) -> Self:
        """The owner the trusted headers name ("" for a property the gateway did not set)."""
        return cls(ctx.prop("tenant"), ctx.prop("user_id"))

    @property
    def identified(self) -> bool:
        """Both halves are identifiers (set, and safe as key tokens)."""
        return is_identifier(self.tenant) and is_identifier(self.user_id)

    def key(self, *parts: str) -> str:
        """`<tenant>.<user_id>.<part>…`, as they are: for ids checked to be identifiers (a run
        id, a digest) or `*` to match every key of a level (`owner.key("*")`: all their runs)."""
        return ".".join((self.tenant, self.user_id, *parts))

    def safe_key(self, *parts: str) -> str:
        """`key`, with every token that is no identifier (the owner's too) replaced by
        `token`'s hash: a valid KV key whatever the ids hold."""
        return ".".join(map(token, (self.tenant, self.user_id, *parts)))

    def user_key(self, *parts: str) -> str:
        """`<user_id>.<part>…`: a key inside something that is the tenant's already (its
        leases), so another user's run of the same id never shares it."""
        return ".".join((self.user_id, *parts))


def digest(text: str) -> str:
    """A short hash of `text` (any characters), safe as one key token: for ids a model or a
    client chose (call ids)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def token(value: str) -> str:
    """`value` when it is an identifier (safe as one key token), else `h-` and its `digest`."""
    return value if is_identifier(value) else "h-" + digest(value)
