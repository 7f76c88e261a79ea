"""After a fault is healed: read everything back from the cluster (the events stream, the
history stream, the sessions bucket, every host's booking ledger) and count what each run
left, against what the client was told."""

import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.api import DeliverPolicy

from runbus import subjects
from tests.cluster.booking_tools import LEDGER_FILE
from tests.cluster.harness import NODES, TENANT, USER, Cluster
from tests.cluster.workload import EVENT, TERMINAL, Workload
from tests.helpers import eventually

STEPS = ("in0", "m0", "t0", "m1", "t1", "m2")
"""Message ids (after `<run_id>:`) a completed run leaves in its session's history: the
input, weather call, its result, booking call, its result, the answer."""
READ_ERRORS = (nats.errors.Error, nats.js.errors.Error, TimeoutError)
READ_STALL = 20.0
"""Seconds a read-back may wait for its next message before it fails as incomplete."""


@dataclass
class Counts:
    fault: str
    acknowledged: int = 0
    unacknowledged: int = 0
    """Requests the client gave up sending (never acknowledged: no promise was made)."""
    one_final: int = 0
    completed: int = 0
    failed: int = 0
    lost: list[str] = field(default_factory=list)
    """Acknowledged runs with no final event stored, or whose final event the client saw
    but the stream does not hold."""
    duplicated: list[str] = field(default_factory=list)
    after_final: list[str] = field(default_factory=list)
    """Runs with events after their final one other than text: work done once the run had
    ended (a step, a call, a result, another ending)."""
    text_after_final: list[str] = field(default_factory=list)
    """Runs whose only events after their final one are text deltas: a model reply that was
    already streaming when its delivery was cut off (clients stop at the final event)."""
    double_bookings: list[str] = field(default_factory=list)
    bookings_missing: list[str] = field(default_factory=list)
    """Completed runs whose booking no ledger holds."""
    histories_valid: int = 0
    invalid_histories: dict[str, str] = field(default_factory=dict)
    stored_twice: dict[str, str] = field(default_factory=dict)
    """Histories whose every step is there once as loaded, but whose stream holds some
    message twice (two batches of two deliveries; every load keeps the first copy)."""
    claimed: list[str] = field(default_factory=list)
    """Sessions of this fault's runs still claimed once every run finished."""
    approvals: int = 0
    approvals_completed: int = 0
    minority_unaccepted: list[str] = field(default_factory=list)
    """Final events a client on the minority side saw that the stream never stored."""
    failures: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    """Runs in flight when the fault began."""
    recover_s: float = 0.0
    """Seconds from the heal until every run was final, the queue empty and no session
    claimed."""
    fault_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def problems(self) -> dict[str, object]:
        """What must be empty: each with the run ids, for the failure's message."""
        found: dict[str, object] = {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "events after the final one": self.after_final,
            "text after the final one": self.text_after_final,
            "double bookings": self.double_bookings,
            "invalid histories": self.invalid_histories,
            "messages stored twice": self.stored_twice,
            "sessions left claimed": self.claimed,
            "completed on the minority, never stored": self.minority_unaccepted,
            "approvals not completed": self.approvals - self.approvals_completed,
        }
        return {name: value for name, value in found.items() if value}

    def row(self) -> dict[str, object]:
        return {
            "fault": self.fault,
            "in flight at fault": self.in_flight,
            "acknowledged": self.acknowledged,
            "exactly one final": self.one_final,
            "completed": self.completed,
            "failed": self.failed,
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "events after final": len(self.after_final),
            "text after final": len(self.text_after_final),
            "double bookings": len(self.double_bookings),
            "histories valid": f"{self.histories_valid}/{self.completed}",
            "messages stored twice": len(self.stored_twice),
            "sessions left claimed": len(self.claimed),
            "approvals completed": f"{self.approvals_completed}/{self.approvals}",
            "minority completions not stored": len(self.minority_unaccepted),
            "fault held (s)": f"{self.fault_s:.1f}",
            "recovered in (s)": f"{self.recover_s:.1f}",
        }


async def stored(nc: NATS, stream: str, subject: str) -> list[tuple[str, bytes]]:
    """Every message of `stream` on `subject` (wildcards allowed), oldest first: as many as the
    stream counted when asked, so a slow delivery never passes for the end of the stream."""
    js = nc.jetstream()
    counted = (await js.stream_info(stream, subjects_filter=subject)).state.subjects or {}
    expected = sum(counted.values())
    if expected == 0:
        return []
    subscription = await js.subscribe(
        subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    out: list[tuple[str, bytes]] = []
    try:
        while len(out) < expected:
            try:
                msg = await subscription.next_msg(timeout=READ_STALL)
            except nats.errors.TimeoutError:
                raise AssertionError(
                    f"read {len(out)} of the {expected} messages of {subject} in {stream}"
                ) from None
            out.append((msg.subject, msg.data))
        return out
    finally:
        await subscription.unsubscribe()


def bookings(root: Path) -> Counter[str]:
    """Bookings made per run, over every host's ledger."""
    made: Counter[str] = Counter()
    for host in NODES:
        ledger = root / host / "data" / LEDGER_FILE
        if ledger.exists():
            made.update(json.loads(line)["run_id"] for line in ledger.read_text().splitlines())
    return made


async def run_events(nc: NATS, run_ids: set[str]) -> dict[str, list[bytes]]:
    """Every event the events stream holds, per run, in order."""
    out: dict[str, list[bytes]] = {run_id: [] for run_id in run_ids}
    for _, data in await stored(nc, subjects.EVENTS_STREAM, subjects.events(TENANT, USER, "*")):
        event = EVENT.decode(data)
        if event.run_id in out:
            out[event.run_id].append(data)
    return out


def finals(events: list[bytes]) -> list[bytes]:
    return [data for data in events if EVENT.decode(data).type in TERMINAL]


async def claimed_sessions(nc: NATS, sessions: set[str]) -> list[str]:
    bucket = await nc.jetstream().key_value(subjects.SESSIONS_BUCKET)
    held = []
    for session in sorted(sessions):
        try:
            entry = await bucket.get(subjects.session_key(TENANT, session))
        except nats.js.errors.KeyNotFoundError:
            continue
        record = msgspec.json.decode(entry.value or b"{}")
        if record.get("active_run"):
            held.append(f"{session} (by {record['active_run']})")
    return held


async def has_final(nc: NATS, run_id: str) -> bool:
    """Whether the stream holds a final event of `run_id` (usually its last one; other
    events after it are counted by `check`)."""
    subject = subjects.events(TENANT, USER, run_id)
    try:
        last = await nc.jetstream().get_last_msg(subjects.EVENTS_STREAM, subject)
    except nats.js.errors.NotFoundError:
        return False
    if last.data and EVENT.decode(last.data).type in TERMINAL:
        return True
    return bool(finals([data for _, data in await stored(nc, subjects.EVENTS_STREAM, subject)]))


CLAIMS_WITHIN = 10.0
"""Seconds a finished run's session claim may outlive its final event (it is released right
after it; the claim's own expiry is the run deadline, minutes later)."""


@dataclass
class Recovery:
    """What was still not so once recovery stopped being waited for."""

    unfinished: list[str] = field(default_factory=list)
    """Acknowledged runs with no final event."""
    queue_left: int = 0
    """Run requests still in the run queue."""
    claimed: list[str] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)
    """Record and stored events of each stuck run."""

    @property
    def stuck(self) -> bool:
        return bool(self.unfinished or self.queue_left)

    def __str__(self) -> str:
        return "; ".join(
            [
                f"not final: {self.unfinished}",
                f"left in the queue: {self.queue_left}",
                f"claimed: {self.claimed}",
                *self.diagnosis,
            ]
        )


async def recover(cluster: Cluster, load: Workload, timeout: float) -> Recovery:
    """Wait until every acknowledged run is final and the run queue empty (`timeout`), then
    until no session of the load is claimed (`CLAIMS_WITHIN`); what was still not so."""
    assert cluster.observer is not None
    nc = cluster.observer
    sessions = {run.session_id for run in load.by_id.values()}
    left = Recovery(unfinished=sorted(r.run_id for r in load.by_id.values() if r.acknowledged))

    async def finished() -> bool:
        left.unfinished = [run_id for run_id in left.unfinished if not await has_final(nc, run_id)]
        info = await nc.jetstream().stream_info(subjects.RUNS_STREAM)
        left.queue_left = info.state.messages
        return not left.stuck

    async def released() -> bool:
        left.claimed = await claimed_sessions(nc, sessions)
        return not left.claimed

    with contextlib.suppress(AssertionError):
        await eventually(finished, timeout, retrying=READ_ERRORS, interval=0.5)
        await eventually(released, CLAIMS_WITHIN, retrying=READ_ERRORS, interval=0.5)
    left.claimed = await claimed_sessions(nc, sessions)
    holders = [claim.split(" (by ")[-1].rstrip(")") for claim in left.claimed]
    for run_id in sorted({*left.unfinished, *holders}):
        left.diagnosis.append(await describe(cluster, run_id))
    return left


async def describe(cluster: Cluster, run_id: str) -> str:
    """A run's record and the types of its stored events, for a failure's message."""
    assert cluster.observer is not None
    nc = cluster.observer
    js = nc.jetstream()
    try:
        records = await js.key_value(subjects.RUN_STATE_BUCKET)
        entry = await records.get(f"{TENANT}.{USER}.{run_id}")
        record = msgspec.json.decode(entry.value or b"{}")
        said = f"status={record.get('status')} attempts={record.get('attempts')}"
        if record.get("error"):
            said += f" error={record['error'].get('code')}"
    except nats.js.errors.KeyNotFoundError:
        said = "no record"
    events = [
        EVENT.decode(data).type
        for _, data in await stored(
            nc, subjects.EVENTS_STREAM, subjects.events(TENANT, USER, run_id)
        )
    ]
    return f"{run_id}: {said}, events {events}"


async def check(
    cluster: Cluster, load: Workload, *, minority_seen: dict[str, list[bytes]] | None = None
) -> Counts:
    """Count what the durable state says about every run of `load`."""
    assert cluster.observer is not None
    nc = cluster.observer
    counts = Counts(fault=load.prefix)
    runs = list(load.by_id.values())
    acked = {run.run_id for run in runs if run.acknowledged}
    counts.acknowledged = len(acked)
    counts.unacknowledged = len(runs) - len(acked)
    events = await run_events(nc, {run.run_id for run in runs})
    have = {run_id: finals(found) for run_id, found in events.items()}
    made = bookings(cluster.root)
    histories: dict[str, list[dict[str, object]]] = {}
    for subject, data in await stored(
        nc, subjects.HISTORY_STREAM, subjects.history_log(TENANT, "*")
    ):
        if not subject.rsplit(".", 1)[-1].startswith(f"{load.prefix}-"):
            continue
        append = msgspec.json.decode(data)
        for message in append.get("messages", []):
            histories.setdefault(str(message["message_id"]).split(":")[0], []).append(message)

    for run in runs:
        kinds = [EVENT.decode(data).type for data in have[run.run_id]]
        if run.run_id in acked and not kinds:
            counts.lost.append(run.run_id)
        # What the client was shown must be what the cluster keeps.
        if run.seen and run.seen[0] not in kinds:
            counts.lost.append(f"{run.run_id} (client saw {run.seen[0]})")
        if len(kinds) > 1:
            counts.duplicated.append(f"{run.run_id} ({', '.join(kinds)})")
        if len(kinds) == 1:
            counts.one_final += 1
        kinds_all = [EVENT.decode(data).type for data in events[run.run_id]]
        if kinds and kinds_all[-1] not in TERMINAL:
            after = kinds_all[kinds_all.index(kinds[0]) + 1 :]
            only_text = set(after) == {"run.text_delta"}
            late = counts.text_after_final if only_text else counts.after_final
            late.append(f"{run.run_id} ({', '.join(after)})")
        if made[run.run_id] > 1:
            counts.double_bookings.append(f"{run.run_id} ({made[run.run_id]} bookings)")
        for data in have[run.run_id][:1]:
            event = EVENT.decode(data)
            if event.type == "run.failed":
                counts.failed += 1
                error = event.error or {}
                counts.failures[f"{error.get('code')}: {error.get('message')}"] += 1
                continue
            counts.completed += 1
            if made[run.run_id] == 0:
                counts.bookings_missing.append(run.run_id)
            problem = history_problem(run.run_id, histories.get(run.run_id, []))
            if problem.startswith("repeated") and ";" not in problem:
                counts.stored_twice[run.run_id] = problem
                counts.histories_valid += 1
            elif problem:
                counts.invalid_histories[run.run_id] = problem
            else:
                counts.histories_valid += 1
        if run.agent == "approve":
            counts.approvals += 1
            counts.approvals_completed += kinds == ["run.completed"]

    for run_id, seen in (minority_seen or {}).items():
        for data in seen:
            if data not in have.get(run_id, []):
                counts.minority_unaccepted.append(f"{run_id} ({EVENT.decode(data).type})")
    counts.claimed = await claimed_sessions(nc, {run.session_id for run in runs})
    return counts


def history_problem(run_id: str, messages: list[dict[str, object]]) -> str:
    """What is wrong with a completed run's stored history ("" when nothing): every step
    once, every tool call answered."""
    ids = Counter(str(m["message_id"]) for m in messages)
    repeated = sorted(i for i, n in ids.items() if n > 1)
    missing = [step for step in STEPS if f"{run_id}:{step}" not in ids]
    calls, answered = set(), set()
    for message in messages:
        for content in message.get("contents", []) or []:  # type: ignore[attr-defined]
            if content.get("type") == "function_call":
                calls.add(content["call_id"])
            if content.get("type") == "function_result":
                answered.add(content["call_id"])
    problems = []
    if repeated:
        problems.append(f"repeated {repeated}")
    if missing:
        problems.append(f"missing {missing}")
    if calls - answered:
        problems.append(f"unanswered calls {sorted(calls - answered)}")
    return "; ".join(problems)
