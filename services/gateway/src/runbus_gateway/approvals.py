"""Pending approvals (human in the loop) in a JetStream KV bucket, one key per call, under
the run's owner: a decision sent by anyone else looks up a key that does not exist.

The run waiting on a call watches its key; `approvals.decide` writes the decision with
compare-and-set from `pending`, so the first decision wins on every replica. The record
outlives the gateway: a run redelivered after a restart finds the decision (or the pending
request) and goes on from there.
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Final, Literal

import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.errors import NotFound, RunbusError
from runbus.jetstream import next_update, open_bucket
from runbus.kv import TypedBucket
from runbus.messages.tools import ApprovalGrant, ApprovalRequest
from runbus.owners import Owner, digest

RECORD_TTL: Final = 7 * 24 * 3600.0
POLL: Final = 0.5
"""Seconds between checks of a pending record, on top of the watch (a missed watch update
must not leave a run waiting forever)."""

Status = Literal["pending", "approved", "denied", "expired"]


class ApprovalRecord(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    call_id: str
    tenant: str
    user_id: str
    """Owner of the run: the one person who may decide."""
    request: ApprovalRequest
    status: Status = "pending"
    approver: str = ""
    decided_at: float = 0.0
    note: str = ""

    def grant(self) -> ApprovalGrant:
        assert self.status != "pending"
        return ApprovalGrant(
            decision=self.status,
            digest=self.request.digest,
            approver=self.approver,
            decided_at=self.decided_at,
            note=self.note,
        )


class AlreadyDecided(RunbusError):
    code = "conflict"

    def __init__(self, status: str) -> None:
        super().__init__(f"this call was already {status}")
        self.status = status


_DECODER = msgspec.json.Decoder(ApprovalRecord)


def approval_key(owner: Owner, run_id: str, call_id: str) -> str:
    """The run's owner and the run, then a digest of the call id (any characters)."""
    return owner.key(run_id, digest(call_id))


class Approvals:
    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, _DECODER)

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "Approvals":
        return cls(
            await open_bucket(nc, subjects.APPROVALS_BUCKET, ttl=RECORD_TTL, replicas=replicas)
        )

    async def wait(
        self,
        run_id: str,
        call_id: str,
        tenant: str,
        user_id: str,
        request: ApprovalRequest,
        *,
        announce: Callable[[], Awaitable[None]] | None = None,
    ) -> ApprovalGrant:
        """Record the request (once), `announce` it, and wait until someone decides or it
        expires."""
        key = approval_key(Owner(tenant, user_id), run_id, call_id)
        record = ApprovalRecord(
            run_id=run_id, call_id=call_id, tenant=tenant, user_id=user_id, request=request
        )
        while True:
            found = await self.bucket.get(key)
            if found is not None and found[0].request.digest == request.digest:
                break  # this very request, recorded by an earlier delivery: its decision stands
            # A record for other arguments of the same call (say the call was edited while
            # paused) must not answer this one: a yes to harmless arguments is no yes to others.
            if found is None:
                written = await self.bucket.create(key, record)
            else:
                written = await self.bucket.update(key, record, found[1])
            if written is not None:
                break
            # Another delivery wrote it meanwhile: read it again.
        if announce is not None:
            await announce()
        watcher = await self.bucket.kv.watch(key)
        try:
            while True:
                found = await self.bucket.get(key)
                assert found is not None
                record, revision = found
                if record.status != "pending":
                    return record.grant()
                if time.time() >= record.request.expires_at:
                    expired = msgspec.structs.replace(
                        record, status="expired", decided_at=time.time()
                    )
                    if await self.bucket.update(key, expired, revision) is None:
                        continue  # decided meanwhile: read it again
                    return expired.grant()
                left = record.request.expires_at - time.time()
                with contextlib.suppress(TimeoutError):
                    await next_update(watcher, timeout=max(0.01, min(POLL, left)))
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def decide(
        self,
        run_id: str,
        call_id: str,
        tenant: str,
        user_id: str,
        decision: Literal["approved", "denied"],
        note: str,
    ) -> Literal["approved", "denied"]:
        """Write the decision unless one stands; only the run's owner may decide."""
        key = approval_key(Owner(tenant, user_id), run_id, call_id)
        while True:
            found = await self.bucket.get(key)
            if found is None or found[0].tenant != tenant or found[0].user_id != user_id:
                raise NotFound(f"no pending approval for call {call_id!r} of run {run_id!r}")
            record, revision = found
            if record.status != "pending":
                raise AlreadyDecided(record.status)
            decided = msgspec.structs.replace(
                record, status=decision, approver=user_id, decided_at=time.time(), note=note
            )
            if await self.bucket.update(key, decided, revision) is None:
                await asyncio.sleep(0)
                continue
            return decision

    async def pending(self, tenant: str, user_id: str, run_id: str) -> list[str]:
        """The call ids of the run's approvals that wait for a decision, oldest first."""
        found = []
        for key in await self._keys(tenant, user_id, run_id):
            entry = await self.bucket.get(key)
            if entry is not None and entry[0].status == "pending":
                found.append((entry[1], entry[0].call_id))
        return [call_id for _, call_id in sorted(found)]

    async def _keys(self, tenant: str, user_id: str, run_id: str) -> list[str]:
        """The keys of the run's approvals: the bucket also holds the run's pause record
        (`<run>.pause`, `pauses.py`), which is not one."""
        keys = await self.bucket.keys(Owner(tenant, user_id).key(run_id, "*"))
        return [key for key in keys if not key.endswith(".pause")]

    async def withdraw(self, tenant: str, user_id: str, run_id: str) -> int:
        """Close the pending approvals of a run that ended for good (failed or cancelled), so
        none stays decidable for a run that will never act on it; returns how many."""
        withdrawn = 0
        for key in await self._keys(tenant, user_id, run_id):
            found = await self.bucket.get(key)
            if found is None or found[0].status != "pending":
                continue
            record, revision = found
            closed = msgspec.structs.replace(
                record, status="expired", decided_at=time.time(), note="the run ended"
            )
            if await self.bucket.update(key, closed, revision) is not None:  # else decided
                withdrawn += 1
        return withdrawn
