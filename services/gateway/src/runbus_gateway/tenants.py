"""A cap on the runs one tenant has running at once, across every gateway replica.

Each running run holds a lease in a KV entry per tenant (`{<user_id>.<run_id>: expires_at}`,
keyed by the run's owner so another user's run of the same id never holds it), changed only
by compare-and-set, so two replicas cannot both take the last slot. A replica renews its runs'
leases with the run's heartbeat; a replica that dies leaves leases that expire on their own,
and its runs, redelivered under the same run id, keep their slot meanwhile.
"""

import time
from collections.abc import Callable
from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus.jetstream import open_bucket
from runbus.kv import TypedBucket

BUCKET: Final = "runbus_tenant_runs"
CAS_ATTEMPTS: Final = 32
_LEASES = msgspec.json.Decoder(dict[str, float])

LeaseChange = Callable[[dict[str, float]], dict[str, float] | None]
"""A change to one tenant's leases, or None to leave them as they are."""


class TenantLimits(msgspec.Struct, frozen=True):
    """How many runs each tenant may have running at once; 0 means no limit."""

    default: int = 0
    overrides: dict[str, int] = {}

    @classmethod
    def parse(cls, default: int, overrides: str) -> "TenantLimits":
        """`overrides` is `tenant=limit` pairs separated by commas, e.g. `acme=4,globex=16`."""
        parsed: dict[str, int] = {}
        for pair in filter(None, (p.strip() for p in overrides.split(","))):
            tenant, sep, limit = pair.partition("=")
            if not sep or not tenant.strip() or not limit.strip().isdigit():
                raise ValueError(f"expected tenant=limit, got {pair!r}")
            parsed[tenant.strip()] = int(limit)
        return cls(default=default, overrides=parsed)

    def of(self, tenant: str) -> int:
        return self.overrides.get(tenant, self.default)

    @property
    def any(self) -> bool:
        return self.default > 0 or any(v > 0 for v in self.overrides.values())


def admit(leases: dict[str, float], run_id: str, limit: int, now: float) -> bool:
    """Whether `run_id` may run beside the live leases (expired ones do not count)."""
    if run_id in leases:
        return True  # a redelivery of a run that already holds a slot
    live = sum(1 for expires in leases.values() if expires > now)
    return live < limit


class TenantSlots:
    def __init__(self, kv: KeyValue, limits: TenantLimits, *, lease: float) -> None:
        self.bucket = TypedBucket(kv, _LEASES)
        self.limits = limits
        self.lease = lease

    @classmethod
    async def open(
        cls, nc: NATS, limits: TenantLimits, *, lease: float, replicas: int = 1
    ) -> "TenantSlots":
        return cls(await open_bucket(nc, BUCKET, replicas=replicas), limits, lease=lease)

    async def try_acquire(self, tenant: str, run_id: str) -> bool:
        limit = self.limits.of(tenant)
        if limit <= 0:
            return True
        now = time.time()
        return await self._change(
            tenant,
            lambda leases: (
                {
                    **{r: e for r, e in leases.items() if e > now},
                    run_id: now + self.lease,
                }
                if admit(leases, run_id, limit, now)
                else None
            ),
        )

    async def renew(self, tenant: str, run_id: str) -> None:
        if self.limits.of(tenant) <= 0:
            return
        expires = time.time() + self.lease
        await self._change(
            tenant, lambda leases: {**leases, run_id: expires} if run_id in leases else None
        )

    async def release(self, tenant: str, run_id: str) -> None:
        if self.limits.of(tenant) <= 0:
            return
        await self._change(
            tenant,
            lambda leases: (
                {r: e for r, e in leases.items() if r != run_id} if run_id in leases else None
            ),
        )

    async def _change(self, tenant: str, change: LeaseChange) -> bool:
        """Apply `change` by compare-and-set; False when it declines (returns None)."""
        key = tenant  # tenants are identifiers (the tokens file says so), safe as keys
        changed = await self.bucket.change(
            key, lambda leases: change(leases or {}), attempts=CAS_ATTEMPTS
        )
        return changed is not None
