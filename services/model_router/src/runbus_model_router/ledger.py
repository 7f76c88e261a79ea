"""The router's shared state in one JetStream KV bucket (`subjects.MODEL_BUCKET`):

- `tenant.<day>.<tenant>` — the tenant's totals for the day, what budgets are checked against;
- `row.<day>.<tenant>.<hash>` — totals per tenant, user, agent, route and model (the labels are
  in the value; the hash keeps the key short and subject-safe);
- `reasoning.<message_id>` — the provider family that wrote an assistant message's reasoning.

Each replica adds up its calls in memory and folds them into the counters every flush interval
with compare-and-set, so replicas never overwrite each other and a call never waits on a write.
"""

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Callable
from typing import Final, TypeVar

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus import jetstream, subjects
from runbus.kv import TypedBucket
from runbus.messages.model import TenantUsage, UsageRow

from .usage import add_rows, add_totals

log = structlog.get_logger()

RETENTION: Final = 35 * 24 * 3600.0
"""Seconds a counter or provenance entry is kept after its last update."""
CAS_ATTEMPTS: Final = 20
_SAFE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
_ROW: Final = msgspec.json.Decoder(UsageRow)
_TOTAL: Final = msgspec.json.Decoder(TenantUsage)

T = TypeVar("T", UsageRow, TenantUsage)


def key_token(value: str) -> str:
    """`value` if it is safe as one key token, else `=` and a hash of it (`=` never appears
    in a safe token, so the two cannot collide)."""
    if _SAFE.match(value):
        return value
    return "=" + hashlib.sha256(value.encode()).hexdigest()[:24]


def row_key(day: str, usage: UsageRow) -> str:
    labels = "\x1f".join((usage.user_id, usage.agent, usage.route, usage.model))
    digest = hashlib.sha256(labels.encode()).hexdigest()[:24]
    return f"row.{day}.{key_token(usage.tenant)}.{digest}"


def tenant_key(day: str, tenant: str) -> str:
    return f"tenant.{day}.{key_token(tenant)}"


async def open_bucket(nc: NATS, *, replicas: int) -> KeyValue:
    """The bucket, created on first start (every replica may race to do it)."""
    return await jetstream.open_bucket(
        nc,
        subjects.MODEL_BUCKET,
        replicas=replicas,
        ttl=RETENTION,
        description="runbus model router: usage counters, reasoning provenance",
    )


class KvLedger:
    def __init__(self, kv: KeyValue, *, flush_every: float) -> None:
        self.row_counters = TypedBucket(kv, _ROW)
        self.tenant_counters = TypedBucket(kv, _TOTAL)
        self.flush_every = flush_every
        self.rows_due: dict[str, UsageRow] = {}
        """Row key → usage of this replica not yet in the bucket."""
        self.totals_due: dict[str, TenantUsage] = {}
        """Tenant key → the same usage summed per tenant and day."""
        self._writing: dict[str, TenantUsage] = {}
        self._read: dict[str, tuple[float, TenantUsage]] = {}
        """Tenant key → (when, the bucket's total): budget checks read the bucket at most once
        per flush interval per tenant, since other replicas' usage arrives no faster."""
        self._flushes = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_every)
            try:
                await self.flush()
            except Exception:  # the bucket is back next time; the usage waits for it
                log.exception("usage_flush_failed", rows=len(self.rows_due))

    def record(self, day: str, usage: UsageRow) -> None:
        key = row_key(day, usage)
        known = self.rows_due.get(key)
        self.rows_due[key] = add_rows(known, usage) if known else usage
        key = tenant_key(day, usage.tenant)
        self.totals_due[key] = add_totals(
            self.totals_due.get(key) or TenantUsage(tenant=usage.tenant), usage
        )

    async def spent(self, day: str, tenant: str) -> TenantUsage:
        key = tenant_key(day, tenant)
        read = self._read.get(key)
        if read is None or time.monotonic() - read[0] > self.flush_every:
            flushes = self._flushes
            try:
                read = (time.monotonic(), await self._stored(key, tenant))
            except (nats.errors.Error, TimeoutError) as exc:
                # Counters out of reach: go on with what this replica knows rather than stop
                # every budgeted tenant's calls while JetStream recovers.
                log.warning("usage_counters_unreachable", tenant=tenant, error=str(exc))
                read = read or (0.0, TenantUsage(tenant=tenant))
            else:
                if flushes == self._flushes:  # a flush meanwhile may have made it stale
                    self._read[key] = read
        spent = read[1]
        for local in (self.totals_due.get(key), self._writing.get(key)):
            if local is not None:
                spent = add_totals(spent, local)
        return spent

    async def _stored(self, key: str, tenant: str) -> TenantUsage:
        return await self.tenant_counters.value(key) or TenantUsage(tenant=tenant)

    async def flush(self) -> None:
        """Fold this replica's usage into the bucket; what cannot be written stays due."""
        async with self._lock:
            rows, self.rows_due = self.rows_due, {}
            self._writing, self.totals_due = self.totals_due, {}
            try:
                for key in list(rows):
                    await self._add(self.row_counters, key, rows[key], add_rows)
                    del rows[key]
                for key in list(self._writing):
                    await self._add(self.tenant_counters, key, self._writing[key], add_totals)
                    del self._writing[key]
                    self._read.pop(key, None)
            finally:
                self._flushes += 1
                for key, usage in rows.items():
                    known = self.rows_due.get(key)
                    self.rows_due[key] = add_rows(known, usage) if known else usage
                for key, totals in self._writing.items():
                    known_total = self.totals_due.get(key)
                    self.totals_due[key] = (
                        add_totals(known_total, totals) if known_total else totals
                    )
                self._writing = {}

    async def _add(
        self, counters: TypedBucket[T], key: str, delta: T, add: Callable[[T, T], T]
    ) -> None:
        """Add `delta` to the counter at `key` with compare-and-set."""
        await counters.change(
            key,
            lambda stored: delta if stored is None else add(stored, delta),
            attempts=CAS_ATTEMPTS,
        )

    async def rows(self, day: str, tenant: str | None) -> list[UsageRow]:
        await self.flush()
        pattern = f"row.{day}.{key_token(tenant)}.*" if tenant else f"row.{day}.*.*"
        return await self.row_counters.values(pattern)


class KvProvenance:
    """`reasoning.<message_id>` → family, with a small cache in front."""

    CACHE: Final = 4096

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.cache: dict[str, str] = {}
        self._writes: set[asyncio.Task[None]] = set()

    def remember(self, message_id: str, family: str) -> None:
        self._cache(message_id, family)
        task = asyncio.create_task(self._put(message_id, family))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, message_id: str, family: str) -> None:
        try:
            await self.kv.put(f"reasoning.{message_id}", family.encode())
        except Exception:
            log.exception("reasoning_provenance_not_saved", message_id=message_id)

    def _cache(self, message_id: str, family: str) -> None:
        if len(self.cache) >= self.CACHE:
            self.cache.pop(next(iter(self.cache)))
        self.cache[message_id] = family

    async def families(self, message_ids: list[str]) -> dict[str, str]:
        found = {m: self.cache[m] for m in message_ids if m in self.cache}
        for message_id in message_ids:
            if message_id in found or not message_id or not _SAFE.match(message_id):
                continue
            try:
                entry = await self.kv.get(f"reasoning.{message_id}")
            except nats.js.errors.KeyNotFoundError:
                continue
            if entry.value:
                found[message_id] = entry.value.decode()
                self._cache(message_id, found[message_id])
        return found

    async def close(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
