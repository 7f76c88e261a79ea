"""One user's model-policy writes are reconciled one at a time across every memory replica: a
key per user in a KV bucket, created only where there is none (compare-and-set), kept alive
while held and deleted when released — only while it is still the holder's. A replica that
died holding one leaves a key that expires with the bucket's TTL."""

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from typing import Final

import structlog
from nats.aio.client import Client as NATS
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from runbus.jetstream import open_bucket

log = structlog.get_logger()

BUCKET: Final = "RUNBUS_MEMORY_LOCKS"
TTL: Final = 30.0
"""Seconds a lock outlives its holder's last sign of life; held ones are renewed every third."""
FIRST_WAIT: Final = 0.02
LONGEST_WAIT: Final = 0.5
"""Backoff between tries to take a lock another replica holds (seconds)."""


class UserLocks:
    def __init__(self, kv: KeyValue, ttl: float = TTL) -> None:
        self.kv = kv
        self.ttl = ttl

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1, ttl: float = TTL) -> "UserLocks":
        kv = await open_bucket(
            nc,
            BUCKET,
            replicas=replicas,
            ttl=ttl,
            description="memory: which replica reconciles each user's writes",
        )
        return cls(kv, ttl)

    @contextlib.asynccontextmanager
    async def hold(self, tenant: str, user_id: str) -> AsyncIterator[None]:
        """The user's lock, waited for while another replica holds it, released on every path
        out."""
        key = lock_key(tenant, user_id)
        owner = uuid.uuid4().hex.encode()
        held = Held(key, await self._take(key, owner, tenant, user_id))
        keeper = asyncio.create_task(self._keep(held, owner))
        try:
            yield
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            # Only while it is still ours: a key taken over after expiry is the new holder's.
            with contextlib.suppress(Exception):
                await self.kv.delete(key, last=held.revision)

    async def _take(self, key: str, owner: bytes, tenant: str, user_id: str) -> int:
        wait = FIRST_WAIT
        waited = False
        while True:
            try:
                revision: int = await self.kv.create(key, owner)
                return revision
            except KeyWrongLastSequenceError:
                if not waited:
                    log.info("memory_user_lock_waiting", tenant=tenant, user_id=user_id)
                    waited = True
            await asyncio.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT)

    async def _keep(self, held: "Held", owner: bytes) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                held.revision = await self.kv.update(held.key, owner, last=held.revision)
            except KeyWrongLastSequenceError:
                log.warning("memory_user_lock_lost", key=held.key)
                return
            except Exception as exc:  # the bus hiccuped: the next renewal tries again
                log.warning("memory_user_lock_renewal_failed", key=held.key, error=repr(exc))


class Held:
    def __init__(self, key: str, revision: int) -> None:
        self.key = key
        self.revision = revision


def lock_key(tenant: str, user_id: str) -> str:
    """A KV key for any tenant and user id (KV keys allow few characters)."""
    return hashlib.sha256(f"{tenant}\0{user_id}".encode()).hexdigest()[:40]
