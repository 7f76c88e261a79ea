"""Run records — a JetStream KV bucket keyed by tenant, user and run, and, for a run in flight
that has no record yet, the run's own events read as one — and which failures are worth
another delivery."""

import contextlib
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.headers import PROP_PREFIX
from runbus.jetstream import open_bucket
from runbus.kv import TypedBucket
from runbus.messages import (
    RunApprovalRequested,
    RunCompleted,
    RunFailed,
    RunPaused,
    RunStarted,
)
from runbus.messages.runs import RUN_EVENT_DECODER, RUN_RECORD_DECODER, RunRecord, RunStatus
from runbus.owners import Owner
from runbus.telemetry import traceparent_trace_id

RETRYABLE: Final = frozenset({"unavailable"})
"""Failures worth another delivery: a service or NATS did not answer (down, died mid-call,
went silent past its idle timeout, or NATS was briefly out of reach). An `internal` error is
a bug, which another delivery repeats (model calls and all). A model error, including
`model_unavailable`, is final: the model router has already retried and failed over under
its route policy, and a re-run would only repeat that. Everything else (bad input, auth,
limits, cancel) is final at once."""
DEAD_LETTERED: Final = RETRYABLE | {"internal"}
"""Failures whose request is kept in the dead letters for an operator: what kept failing, and
what broke (a bug: replayable once it is fixed)."""

RECORD_TTL: Final = 7 * 24 * 3600.0


class RunRecords:
    """Under `<tenant>.<user_id>.<run_id>`: listing a user's runs is a key filter.

    A run's first delivery writes no `running` record: every stored write is an fsync, and its
    events already say it runs. Until something writes its record (a status without an event
    of its own — queued, waiting for a person, a retry — or its end), `get` and `list` read
    the run off its events (`projected`): the owner is in their subject, so only the owner's
    events are read. Once written, the record wins.
    """

    def __init__(self, kv: KeyValue, js: JetStreamContext) -> None:
        self.bucket = TypedBucket(kv, RUN_RECORD_DECODER)
        self.js = js

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "RunRecords":
        kv = await open_bucket(nc, subjects.RUN_STATE_BUCKET, ttl=RECORD_TTL, replicas=replicas)
        return cls(kv, nc.jetstream())

    async def get(self, tenant: str, user_id: str, run_id: str) -> RunRecord | None:
        record = await self.stored(tenant, user_id, run_id)
        return record if record is not None else await self.projected(tenant, user_id, run_id)

    async def stored(self, tenant: str, user_id: str, run_id: str) -> RunRecord | None:
        """The run's stored record only (one read), without the projection of its events."""
        return await self.bucket.value(Owner(tenant, user_id).key(run_id))

    async def projected(self, tenant: str, user_id: str, run_id: str) -> RunRecord | None:
        """The run as its events tell it: started by its first event, where it stands by its
        last; None when it has no `run.started` (it never ran, or its events expired)."""
        subject = subjects.events(tenant, user_id, run_id)
        try:
            first = await self.js.get_msg(
                subjects.EVENTS_STREAM, seq=1, subject=subject, next=True, direct=True
            )
            last = await self.js.get_last_msg(subjects.EVENTS_STREAM, subject, direct=True)
        except NotFoundError:
            return None
        started = _event(first)
        if not isinstance(started, RunStarted):
            return None
        headers = first.headers or {}
        record = RunRecord(
            run_id=run_id,
            agent=started.agent,
            session_id=started.session_id,
            tenant=tenant,
            user_id=user_id,
            status="running",
            created_at=_stored_at(first),
            updated_at=_stored_at(last),
            trace_id=traceparent_trace_id(headers),
            parent_run_id=headers.get(f"{PROP_PREFIX}parent_run_id", ""),
            root_run_id=headers.get(f"{PROP_PREFIX}root_run_id", ""),
            depth=_depth(headers.get(f"{PROP_PREFIX}depth", "")),
        )
        match _event(last):
            case RunCompleted(text=text, output=output):
                return msgspec.structs.replace(record, status="completed", text=text, output=output)
            case RunFailed(error=error):
                return msgspec.structs.replace(record, status="failed", error=error)
            case RunApprovalRequested():
                return msgspec.structs.replace(record, status="waiting_approval")
            case RunPaused():
                return msgspec.structs.replace(record, status="paused")
            case _:
                return record

    async def put(self, record: RunRecord) -> None:
        await self.bucket.put(Owner(record.tenant, record.user_id).key(record.run_id), record)

    async def set_status(self, record: RunRecord, status: RunStatus, **changes: Any) -> RunRecord:
        """Store `record` with a new status (and any other `changes`), stamped now."""
        changed = msgspec.structs.replace(record, status=status, updated_at=now(), **changes)
        await self.put(changed)
        return changed

    async def list(self, tenant: str, user_id: str) -> list[RunRecord]:
        """The owner's recorded runs, and those in flight with no record yet."""
        keys = await self.bucket.keys(Owner(tenant, user_id).key("*"))
        records = []
        for key in keys:
            record = await self.bucket.value(key)
            if record is not None:
                records.append(record)
        recorded = {r.run_id for r in records}
        for run_id in await _runs_with_events(self.js, tenant, user_id):
            if run_id not in recorded:
                projected = await self.projected(tenant, user_id, run_id)
                if projected is not None:
                    records.append(projected)
        return records


async def _runs_with_events(js: JetStreamContext, tenant: str, user_id: str) -> list[str]:
    """Runs of the owner with events in the stream (its subjects: the owner is in them)."""
    owned = subjects.events(tenant, user_id, "*")
    info = await js.stream_info(subjects.EVENTS_STREAM, subjects_filter=owned)
    return [subject.rsplit(".", 1)[1] for subject in info.state.subjects or {}]


def _event(msg: RawStreamMsg) -> object:
    """A stored message of a run's subject as its event; None if it is not one today's
    types know (a newer producer's)."""
    with contextlib.suppress(msgspec.DecodeError):
        return RUN_EVENT_DECODER.decode(msg.data or b"")
    return None


def _stored_at(msg: RawStreamMsg) -> datetime:
    return (msg.time or now()).astimezone(UTC)


def _depth(text: str) -> int:
    return int(text) if text.isdigit() else 0


def now() -> datetime:
    return datetime.now(UTC)
