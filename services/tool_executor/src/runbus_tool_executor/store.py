"""JetStream KV behind the executor: call records by idempotency key, and the shared catalog."""

import asyncio
from collections.abc import Iterable, Sequence
from typing import Final

from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.jetstream import open_bucket
from runbus.kv import TypedBucket

from .calls import CALL_RECORD_DECODER, CallRecord
from .catalog import CATALOG_ENTRY_DECODER, CatalogEntry
from .registry import TOOL_NAME

CALL_RECORD_TTL: Final = 24 * 3600.0
"""Seconds a call record is kept: far longer than any run retries a call."""
CATALOG_TTL: Final = 7 * 24 * 3600.0
"""Seconds an entry of a deployment that is gone lingers before JetStream drops it."""


async def open_stores(nc: NATS, *, replicas: int) -> tuple["KvCallStore", "KvCatalog"]:
    calls, catalog = await asyncio.gather(
        open_bucket(
            nc,
            subjects.TOOL_CALLS_BUCKET,
            ttl=CALL_RECORD_TTL,
            replicas=replicas,
            description="runbus tool calls by idempotency key (run id + call id)",
        ),
        open_bucket(
            nc,
            subjects.TOOL_CATALOG_BUCKET,
            ttl=CATALOG_TTL,
            replicas=replicas,
            description="runbus tool catalog: every deployment's tools",
        ),
    )
    return KvCallStore(calls), KvCatalog(catalog)


class KvCallStore:
    """Call records in the `RUNBUS_TOOL_CALLS` bucket; compare-and-set keeps one runner."""

    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, CALL_RECORD_DECODER)

    async def get(self, key: str) -> tuple[CallRecord, int] | None:
        return await self.bucket.get(key)

    async def claim(self, key: str, record: CallRecord) -> bool:
        return await self.bucket.create(key, record) is not None

    async def take_over(self, key: str, record: CallRecord, revision: int) -> bool:
        return await self.bucket.update(key, record, revision) is not None

    async def finish(self, key: str, record: CallRecord) -> None:
        await self.bucket.put(key, record)


class KvCatalog:
    """Catalog entries in the `RUNBUS_TOOL_CATALOG` bucket, one key per tool name."""

    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, CATALOG_ENTRY_DECODER)

    async def publish(self, entries: Iterable[CatalogEntry]) -> None:
        await asyncio.gather(*(self.bucket.put(e.spec.name, e) for e in entries))

    async def get(self, names: Sequence[str]) -> list[CatalogEntry]:
        safe = [n for n in dict.fromkeys(names) if TOOL_NAME.fullmatch(n)]
        found = await asyncio.gather(*(self._get(n) for n in safe))
        return [e for e in found if e is not None]

    async def all(self) -> list[CatalogEntry]:
        return await self.get(await self.bucket.keys())

    async def _get(self, name: str) -> CatalogEntry | None:
        return await self.bucket.value(name)
