"""Run records in a JetStream KV bucket, keyed by tenant, user and run, and which failures are
worth another delivery."""

from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.jetstream import open_bucket
from runbus.kv import TypedBucket
from runbus.messages.runs import RUN_RECORD_DECODER, RunRecord, RunStatus
from runbus.owners import Owner

RETRYABLE: Final = frozenset({"unavailable", "internal"})
"""Failures worth another delivery: a service did not answer (down, died mid-call, or went
silent past its idle timeout) or something broke unexpectedly. A model error, including
`model_unavailable`, is final: the model router has already retried and failed over under
its route policy, and a re-run would only repeat that. Everything else (bad input, auth,
limits, cancel) is final at once."""

RECORD_TTL: Final = 7 * 24 * 3600.0


class RunRecords:
    """Under `<tenant>.<user_id>.<run_id>`: listing a user's runs is a key filter."""

    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, RUN_RECORD_DECODER)

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "RunRecords":
        return cls(
            await open_bucket(nc, subjects.RUN_STATE_BUCKET, ttl=RECORD_TTL, replicas=replicas)
        )

    async def get(self, tenant: str, user_id: str, run_id: str) -> RunRecord | None:
        return await self.bucket.value(Owner(tenant, user_id).key(run_id))

    async def put(self, record: RunRecord) -> None:
        await self.bucket.put(Owner(record.tenant, record.user_id).key(record.run_id), record)

    async def set_status(self, record: RunRecord, status: RunStatus, **changes: Any) -> RunRecord:
        """Store `record` with a new status (and any other `changes`), stamped now."""
        changed = msgspec.structs.replace(record, status=status, updated_at=now(), **changes)
        await self.put(changed)
        return changed

    async def list(self, tenant: str, user_id: str) -> list[RunRecord]:
        keys = await self.bucket.keys(Owner(tenant, user_id).key("*"))
        records = []
        for key in keys:
            record = await self.get(tenant, user_id, key.rsplit(".", 1)[1])
            if record is not None:
                records.append(record)
        return records


def now() -> datetime:
    return datetime.now(UTC)
