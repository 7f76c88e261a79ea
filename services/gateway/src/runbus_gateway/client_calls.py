"""Calls of the client's own tools a run waits on, one KV record per call under the run's owner
(in the approvals bucket, as `<tenant>.<user_id>.<run_id>.client.<digest of call id>`): an answer
sent by anyone else looks up a key that does not exist.

The run records the call (`pending`) and waits on its key; `client_tools.answer` writes the
result with compare-and-set from `pending`, so one answer wins on every replica. The record
outlives the gateway: a run redelivered after a restart finds its call checkpointed in history,
then here the answer (or the call still pending) and goes on from there — the client's tool is
never asked twice.
"""

import contextlib
import time
from typing import Final, Literal

import msgspec
from nats.js.kv import KeyValue

from runbus.errors import Conflict, NotFound
from runbus.jetstream import next_update
from runbus.kv import TypedBucket
from runbus.messages import FunctionCallContent, FunctionResultContent
from runbus.owners import Owner, digest

ANSWER_WITHIN: Final = 3600.0
"""Seconds a run waits for the client's answer before the model is told there was none."""
POLL: Final = 0.5
"""Seconds between checks of a pending record, on top of the watch."""
NO_ANSWER: Final = "the client did not answer this call in time; its tool did not report"

Status = Literal["pending", "answered", "withdrawn"]


class ClientCallRecord(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    call_id: str
    tenant: str
    user_id: str
    """Owner of the run: the one person who may answer."""
    call: FunctionCallContent
    """The call as the model made it, for the client that follows the run late."""
    expires_at: float
    """Seconds since the epoch after which the run goes on without an answer."""
    status: Status = "pending"
    result: FunctionResultContent | None = None
    """The client's answer, once `answered` (or the "no answer" error once `withdrawn`)."""


class AlreadyAnswered(Conflict):
    def __init__(self, call_id: str, status: str) -> None:
        super().__init__(f"call {call_id!r} was already {status}")
        self.call_id = call_id
        self.status = status


_DECODER = msgspec.json.Decoder(ClientCallRecord)


def client_call_key(owner: Owner, run_id: str, call_id: str) -> str:
    return owner.key(run_id, "client", digest(call_id))


class ClientCalls:
    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, _DECODER)

    async def record(self, run_id: str, owner: Owner, call: FunctionCallContent) -> None:
        """Record the call as pending, once (a redelivered run finds it): before the client
        can read the call, so its answer always finds the record."""
        key = client_call_key(owner, run_id, call.call_id)
        if await self.bucket.get(key) is None:
            record = ClientCallRecord(
                run_id=run_id,
                call_id=call.call_id,
                tenant=owner.tenant,
                user_id=owner.user_id,
                call=call,
                expires_at=time.time() + ANSWER_WITHIN,
            )
            await self.bucket.create(key, record)  # another delivery may have been first

    async def wait(
        self, run_id: str, owner: Owner, call: FunctionCallContent
    ) -> FunctionResultContent:
        """Wait for the answer to a recorded call (recorded here if it was not)."""
        key = client_call_key(owner, run_id, call.call_id)
        await self.record(run_id, owner, call)
        watcher = await self.bucket.kv.watch(key)
        try:
            while True:
                found = await self.bucket.get(key)
                if found is None:  # purged with its run's session: nobody will answer
                    return FunctionResultContent(call_id=call.call_id, error=NO_ANSWER)
                record, revision = found
                if record.result is not None:
                    return record.result
                if time.time() >= record.expires_at:
                    timed_out = FunctionResultContent(call_id=call.call_id, error=NO_ANSWER)
                    closed = msgspec.structs.replace(record, status="withdrawn", result=timed_out)
                    if await self.bucket.update(key, closed, revision) is None:
                        continue  # answered meanwhile: read it again
                    return timed_out
                left = record.expires_at - time.time()
                with contextlib.suppress(TimeoutError):
                    await next_update(watcher, timeout=max(0.01, min(POLL, left)))
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def answer(
        self, run_id: str, call_id: str, owner: Owner, result: FunctionResultContent
    ) -> None:
        """Write the client's answer unless one stands; only the run's owner may answer."""
        key = client_call_key(owner, run_id, call_id)
        while True:
            found = await self.bucket.get(key)
            if found is None or (found[0].tenant, found[0].user_id) != (
                owner.tenant,
                owner.user_id,
            ):
                raise NotFound(f"no call {call_id!r} of run {run_id!r} waits for an answer")
            record, revision = found
            if record.status != "pending":
                raise AlreadyAnswered(call_id, record.status)
            answered = msgspec.structs.replace(record, status="answered", result=result)
            if await self.bucket.update(key, answered, revision) is not None:
                return

    async def withdraw(self, owner: Owner, run_id: str) -> int:
        """Close the pending calls of a run that ended for good (failed or cancelled): an
        answer to one is then a `conflict`, not a write nobody reads; returns how many."""
        withdrawn = 0
        for key in await self.bucket.keys(owner.key(run_id, "client", "*")):
            found = await self.bucket.get(key)
            if found is None or found[0].status != "pending":
                continue
            record, revision = found
            ended = FunctionResultContent(call_id=record.call_id, error="the run ended")
            closed = msgspec.structs.replace(record, status="withdrawn", result=ended)
            if await self.bucket.update(key, closed, revision) is not None:  # else answered
                withdrawn += 1
        return withdrawn
