"""Session records in a JetStream KV bucket, one key per tenant and session.

Writes are compare-and-set on the key's revision, so two gateway replicas claiming one session
cannot both win; no process-local lock is involved.
"""

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import (
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.jetstream import keys_matching, open_bucket
from runbus.messages.sessions import SessionRecord

from .core import RECORD_DECODER

_ENCODER = msgspec.json.Encoder()


class StaleRevision(Exception):
    """The record changed since it was read (another writer won the compare-and-set)."""


class SessionRecords:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "SessionRecords":
        return cls(await open_bucket(nc, subjects.SESSIONS_BUCKET, replicas=replicas))

    async def get(self, tenant: str, session_id: str) -> SessionRecord | None:
        try:
            entry = await self.kv.get(subjects.session_key(tenant, session_id))
        except KeyNotFoundError:
            return None
        if entry.value is None:
            return None
        record = RECORD_DECODER.decode(entry.value)
        return msgspec.structs.replace(record, revision=entry.revision or 0)

    async def create(self, record: SessionRecord) -> SessionRecord | None:
        """Store a new record; None if one exists already."""
        key = subjects.session_key(record.tenant, record.session_id)
        try:
            revision = await self.kv.create(key, self._encode(record))
        except KeyWrongLastSequenceError:
            return None
        return msgspec.structs.replace(record, revision=revision)

    async def update(self, record: SessionRecord) -> SessionRecord:
        """Write `record` if the stored one is still at `record.revision`."""
        key = subjects.session_key(record.tenant, record.session_id)
        try:
            revision = await self.kv.update(key, self._encode(record), last=record.revision)
        except KeyWrongLastSequenceError:
            raise StaleRevision(key) from None
        return msgspec.structs.replace(record, revision=revision)

    async def delete(self, tenant: str, session_id: str) -> None:
        await self.kv.purge(subjects.session_key(tenant, session_id))

    async def list(self, tenant: str) -> list[SessionRecord]:
        keys = await keys_matching(self.kv, f"{tenant}.*")
        records = []
        for key in keys:
            record = await self.get(tenant, key.split(".", 1)[1])
            if record is not None:
                records.append(record)
        return records

    @staticmethod
    def _encode(record: SessionRecord) -> bytes:
        # The revision is the store's, not part of the stored value.
        return _ENCODER.encode(msgspec.structs.replace(record, revision=0))
