"""Session records in a JetStream KV bucket, one key per tenant and session.

Writes are compare-and-set on the key's revision, so two gateway replicas claiming one session
cannot both win; no process-local lock is involved. Records are cached (see `cache`), kept
honest by a watcher that hears every write to the bucket.
"""

import contextlib
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.jetstream import open_bucket
from runbus.kv import TypedBucket
from runbus.messages.sessions import SessionRecord

from .cache import RecordCache
from .core import RECORD_DECODER

_WRITES: Final = f"$KV.{subjects.SESSIONS_BUCKET}."


class StaleRevision(Exception):
    """The record changed since it was read (another writer won the compare-and-set)."""


class SessionRecords:
    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, RECORD_DECODER)
        self.cache = RecordCache()
        self._watch: JetStreamContext.PushSubscription | None = None

    @property
    def kv(self) -> KeyValue:
        return self.bucket.kv

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "SessionRecords":
        """The bucket, created on first use, with the record cache's watcher running."""
        records = cls(await open_bucket(nc, subjects.SESSIONS_BUCKET, replicas=replicas))
        # Only writes from now on matter (the cache starts empty), and only their subject and
        # sequence: headers only.
        records._watch = await nc.jetstream().subscribe(
            f"{_WRITES}>",
            stream=f"KV_{subjects.SESSIONS_BUCKET}",
            cb=records._on_write,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            headers_only=True,
        )
        return records

    async def close(self) -> None:
        """Stop the watcher (nothing to stop on a connection already closed)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await watch.unsubscribe()

    async def _on_write(self, msg: Msg) -> None:
        self.cache.written(msg.subject[len(_WRITES) :], msg.metadata.sequence.stream)

    async def recent(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The record as this replica last heard of it, read only when not cached.

        Good for an ownership check and as the base of a compare-and-set write (which fails
        and re-reads if the record moved on); `get` is the record as stored now.
        """
        cached = self.cache.get(subjects.session_key(tenant, session_id))
        return cached if cached is not None else await self.get(tenant, session_id)

    async def get(self, tenant: str, session_id: str) -> SessionRecord | None:
        key = subjects.session_key(tenant, session_id)
        found = await self.bucket.get(key)
        if found is None:
            return None
        record = msgspec.structs.replace(found[0], revision=found[1])
        self.cache.remember(key, record)
        return record

    async def create(self, record: SessionRecord) -> SessionRecord | None:
        """Store a new record; None if one exists already."""
        key = subjects.session_key(record.tenant, record.session_id)
        revision = await self.bucket.create(key, _stored(record))
        if revision is None:
            return None
        created = msgspec.structs.replace(record, revision=revision)
        self.cache.remember(key, created)
        return created

    async def update(self, record: SessionRecord) -> SessionRecord:
        """Write `record` if the stored one is still at `record.revision`."""
        key = subjects.session_key(record.tenant, record.session_id)
        revision = await self.bucket.update(key, _stored(record), record.revision)
        if revision is None:
            raise StaleRevision(key)
        updated = msgspec.structs.replace(record, revision=revision)
        self.cache.remember(key, updated)
        return updated

    async def delete(self, tenant: str, session_id: str) -> None:
        key = subjects.session_key(tenant, session_id)
        await self.bucket.purge(key)
        self.cache.forget(key)

    async def list(self, tenant: str) -> list[SessionRecord]:
        keys = await self.bucket.keys(subjects.session_key(tenant, "*"))
        records = []
        for key in keys:
            record = await self.get(tenant, key.split(".", 1)[1])
            if record is not None:
                records.append(record)
        return records


def _stored(record: SessionRecord) -> SessionRecord:
    """The record as stored: the revision is the store's, not part of the value."""
    return msgspec.structs.replace(record, revision=0)
