"""Pauses of runs at a step boundary, one KV record per run under its owner (in the approvals
bucket, as `<tenant>.<user_id>.<run_id>.pause`): a pause, an edit or a resume sent by anyone
else looks up a key that does not exist.

`runs.pause` writes `requested`; the run, at its next step boundary, writes `paused` with what
it has not stored yet (the model's reply whose calls have not run) and waits on the key, as a
call waits for an approval; `runs.edit` changes that reply (checked as the model's output is)
and `runs.resume` writes `resumed`. The record outlives the gateway: a run redelivered after a
restart reaches the same boundary, finds it `paused` and waits again with the same reply.

The same record fences a run's deliveries (`fence`): each one after the first writes its
number, and an earlier one the server gave up on, still going, stops at its next boundary.
"""

import contextlib
import time
from collections.abc import Sequence
from typing import Final

import msgspec
from nats.js.kv import KeyValue

from runbus.errors import Unavailable
from runbus.jetstream import next_update
from runbus.kv import KeptChanging, TypedBucket
from runbus.messages import ChatMessage, ToolSpec
from runbus.messages.runs import RunEdit
from runbus.owners import Owner

from .run.pause import NotPaused, PauseRecord, edited

POLL: Final = 0.5
"""Seconds between checks of a paused record, on top of the watch."""
ATTEMPTS: Final = 16
"""Compare-and-set tries of one change before `KeptChanging`."""

_DECODER = msgspec.json.Decoder(PauseRecord)


def pause_key(owner: Owner, run_id: str) -> str:
    return owner.key(run_id, "pause")


class Pauses:
    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, _DECODER)

    async def get(self, owner: Owner, run_id: str) -> PauseRecord | None:
        return await self.bucket.value(pause_key(owner, run_id))

    async def request(self, owner: Owner, run_id: str) -> PauseRecord:
        """Ask the run to pause at its next step boundary (a pause asked for or standing is
        left as it is)."""

        def ask(found: PauseRecord | None) -> PauseRecord | None:
            if found is not None and found.status != "resumed":
                return None
            return PauseRecord(
                run_id=run_id,
                tenant=owner.tenant,
                user_id=owner.user_id,
                generation=1 if found is None else found.generation + 1,
                requested_at=time.time(),
                attempt=0 if found is None else found.attempt,
            )

        written = await self.bucket.change(pause_key(owner, run_id), ask, attempts=ATTEMPTS)
        if written is not None:
            return written
        found = await self.get(owner, run_id)
        assert found is not None
        return found

    async def fence(self, owner: Owner, run_id: str, attempt: int) -> None:
        """Delivery `attempt` of the run (after the first) has started: any earlier delivery
        still going stops at its next boundary (`PauseRecord.attempt`). The run's next boundary
        reads this key anyway (a pause), so a first delivery pays nothing for it."""

        def later(found: PauseRecord | None) -> PauseRecord | None:
            if found is None:
                # No pause: a record that only fences (`resumed` is what no pause reads as).
                return PauseRecord(
                    run_id=run_id,
                    tenant=owner.tenant,
                    user_id=owner.user_id,
                    status="resumed",
                    generation=0,
                    attempt=attempt,
                )
            if found.attempt >= attempt:
                return None
            return msgspec.structs.replace(found, attempt=attempt)

        try:
            await self.bucket.change(pause_key(owner, run_id), later, attempts=ATTEMPTS)
        except KeptChanging:
            # Reads that keep missing the key (a replica catching up) or writers that keep
            # winning: this delivery tries again later rather than run unfenced.
            raise Unavailable(f"run {run_id!r}: delivery {attempt} could not be recorded") from None

    async def reach(
        self,
        owner: Owner,
        run_id: str,
        step: int,
        reply: ChatMessage | None,
        tools: Sequence[ToolSpec],
    ) -> PauseRecord | None:
        """The run is at a step boundary (`reply`: the model's reply whose calls would run
        next): the pause it stops at now, or None. A pause asked for is written `paused` with
        `reply`; one already paused (before a restart) is kept with its own reply."""
        key = pause_key(owner, run_id)
        found = await self.bucket.get(key)
        if found is None or found[0].status == "resumed":
            return None
        record, revision = found
        if record.status == "paused":
            return record
        names = {c.name for c in (reply.function_calls if reply is not None else [])}
        paused = msgspec.structs.replace(
            record,
            status="paused",
            step=step,
            reply=reply,
            tools=[t for t in tools if t.name in names],
            paused_at=time.time(),
        )
        if await self.bucket.update(key, paused, revision) is None:
            return await self.reach(owner, run_id, step, reply, tools)  # resumed meanwhile
        return paused

    async def wait(self, owner: Owner, run_id: str) -> PauseRecord:
        """Wait until the pause is resumed; the record as it was resumed (with its edits)."""
        key = pause_key(owner, run_id)
        watcher = await self.bucket.kv.watch(key)
        try:
            while True:
                record = await self.get(owner, run_id)
                if record is None or record.status == "resumed":
                    return record or PauseRecord(
                        run_id=run_id, tenant=owner.tenant, user_id=owner.user_id, status="resumed"
                    )
                with contextlib.suppress(TimeoutError):
                    await next_update(watcher, timeout=POLL)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def edit(self, owner: Owner, run_id: str, edit: RunEdit) -> PauseRecord:
        """Apply `edit` to a paused run, all of it or (`InvalidEdit`, `NotPaused`) none."""

        def change(found: PauseRecord | None) -> PauseRecord:
            if found is None or found.status != "paused":
                raise NotPaused(run_id, _status(found))
            return edited(found, edit)

        written = await self.bucket.change(pause_key(owner, run_id), change, attempts=ATTEMPTS)
        assert written is not None
        return written

    async def resume(self, owner: Owner, run_id: str) -> PauseRecord:
        """Let a paused run go on, as edited (a pause not reached yet is called off)."""

        def change(found: PauseRecord | None) -> PauseRecord:
            if found is None or found.status == "resumed":
                raise NotPaused(run_id, _status(found))
            return msgspec.structs.replace(found, status="resumed")

        written = await self.bucket.change(pause_key(owner, run_id), change, attempts=ATTEMPTS)
        assert written is not None
        return written


def _status(found: PauseRecord | None) -> str:
    return found.status if found is not None and found.asked else "no pause"
