"""Call records: what the executor knows about a side-effecting call it started, by idempotency
key (the run's owner, run id and call id), so a redelivered or retried call never runs twice."""

from typing import Literal, Protocol

import msgspec

from runbus.messages import FunctionResultContent
from runbus.owners import Owner, digest


class CallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One side-effecting call, written `started` before it runs and `done` after."""

    state: Literal["started", "done"]
    tool: str
    started_at: float
    """Seconds since the epoch."""
    lease_until: float
    """While `started`, the replica running it will have finished (or been cut) by then; a
    `started` record past its lease belongs to an executor that died mid-call."""
    replica: str
    """The executor replica that ran it, for the log."""
    result: FunctionResultContent | None = None
    """Set when `done`: the result every later delivery of the call gets."""


CALL_RECORD_DECODER = msgspec.json.Decoder(CallRecord)


def call_key(owner: Owner, run_id: str, call_id: str) -> str:
    """KV key of a call: the run's owner (from the trusted headers) and run id as they are
    (when subject-safe), and a digest of the call id, which is model-chosen and may hold
    anything. The owner keeps another owner's run of the same id from sharing the record."""
    return owner.safe_key(run_id, digest(call_id))


class CallStore(Protocol):
    """Where call records live (JetStream KV in the service; memory in tests and benchmarks)."""

    async def get(self, key: str) -> tuple[CallRecord, int] | None:
        """The record and its revision, or None."""
        ...

    async def claim(self, key: str, record: CallRecord) -> bool:
        """Write `record` if there is none yet; False if another delivery got there first."""
        ...

    async def take_over(self, key: str, record: CallRecord, revision: int) -> bool:
        """Replace the record at `revision` (a stale `started` one); False if it changed."""
        ...

    async def finish(self, key: str, record: CallRecord) -> None:
        """Write the final record."""
        ...


class MemoryCallStore:
    """A `CallStore` in this process: for tests and benchmarks, never for a deployment."""

    def __init__(self) -> None:
        self.records: dict[str, tuple[CallRecord, int]] = {}
        self._revision = 0

    async def get(self, key: str) -> tuple[CallRecord, int] | None:
        return self.records.get(key)

    async def claim(self, key: str, record: CallRecord) -> bool:
        if key in self.records:
            return False
        self._put(key, record)
        return True

    async def take_over(self, key: str, record: CallRecord, revision: int) -> bool:
        found = self.records.get(key)
        if found is None or found[1] != revision:
            return False
        self._put(key, record)
        return True

    async def finish(self, key: str, record: CallRecord) -> None:
        self._put(key, record)

    def _put(self, key: str, record: CallRecord) -> None:
        self._revision += 1
        self.records[key] = (record, self._revision)
