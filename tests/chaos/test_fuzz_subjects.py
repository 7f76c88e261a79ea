"""Fuzz: every subject the stack answers on gets hypothesis-made hostile requests
(wrong types, unsafe ids, truncated JSON, unknown tags, non-UTF-8, huge strings, forged or
broken headers). Each one gets a typed error or a valid reply, nothing is stored by a request
that was refused or only reads, and every service still answers afterwards."""

import asyncio
import contextlib
import json
from collections import Counter
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from runbus import headers as h
from runbus import subjects
from runbus.messages import RunRequest, is_identifier
from runbus.messages.errors import ERROR_DECODER
from runbus.messages.runs import RUN_EVENT_DECODER, RunCompleted, RunFailed
from tests.chaos.conftest import ChaosReport, chaos_size
from tests.chaos.fuzzing import (
    State,
    Target,
    changed,
    draw_cases,
    stored_state,
    targets,
)
from tests.helpers import eventually, publish_and_collect, raw_request
from tests.stack import SERVICE_NAMES, SecuredNats, Stack

PAYLOADS: Final = chaos_size(12, 100)
RUNS: Final = chaos_size(12, 100)
REPLY_TIMEOUT: Final = 15.0
"""Far over any honest answer on this machine: not answering in time counts as no reply."""

UNUSABLE_RUN_IDS: Final = ("a.b", "*", ">", "x" * 200)

WRITES: Final = frozenset(
    {
        subjects.HISTORY_APPEND,
        subjects.SESSIONS_OPEN,
        subjects.SESSIONS_STATE_UPDATE,
        subjects.SESSIONS_IMPORT,
        subjects.SESSIONS_DELETE,
        subjects.MEMORY_STORE,
        subjects.MEMORY_FORGET,
        # Model calls count usage; compaction's summaries are model calls.
        subjects.MODEL_COMPLETE,
        subjects.COMPACTION_COMPACT,
        # The one side-effecting tool keeps an idempotency record per call.
        subjects.tool_invoke("create_booking"),
        subjects.api("sessions.state.update"),
        subjects.api("sessions.import"),
        subjects.api("sessions.delete"),
        subjects.api("memory.forget"),
        subjects.api("approvals.decide"),
    }
)
"""Subjects whose accepted requests may store something. Everything else only reads: a new
endpoint is held to that until it is listed here."""

RUN_QUEUE_STORES: Final = frozenset(
    {subjects.RUNS_STREAM, subjects.EVENTS_STREAM, f"KV_{subjects.RUN_STATE_BUCKET}"}
)
"""What a refused run request may change: the queue it was published on, its `run.failed`
event, and the record of a run that failed after admission."""


ALICE: Final = {h.AUTH: "Bearer dev-alice", "rb-prop-user_id": "alice", "rb-prop-tenant": "acme"}
VALID: Final = {
    "gateway": (subjects.api("runs.list"), {"type": "runs.list"}),
    "history": (subjects.api("sessions.list"), {"type": "sessions.list"}),
    "memory": (subjects.MEMORY_STATS, {"type": "memory.stats"}),
    "compaction": (
        subjects.COMPACTION_COMPACT,
        {
            "type": "compaction.compact",
            "messages": [{"role": "user", "contents": [{"type": "text", "text": "hi"}]}],
        },
    ),
    "model_router": (subjects.MODEL_USAGE, {"type": "model.usage_query"}),
    "tool_executor": (subjects.TOOLS_LIST, {"type": "tools.list"}),
}
"""One valid request per service, to tell it still serves."""
S1_IMPORT: Final = json.dumps(
    {
        "type": "sessions.import",
        "document": {
            "record": {
                "session_id": "s1",
                "tenant": "acme",
                "owner": "alice",
                "agent": "travel",
                "created_at": "2026-01-01T00:00:00Z",
                "updated_at": "2026-01-01T00:00:00Z",
            },
            "messages": [
                {"role": "user", "contents": [{"type": "text", "text": "Weather in Perth?"}]}
            ],
        },
    }
).encode()
"""Alice's session "s1" (a name the bodies use), so that reads and writes of it can succeed."""


class Tally(Counter[str]):
    def row(self, subject: str) -> dict[str, object]:
        return {
            "subject": subject,
            "payloads": self["payloads"],
            "typed errors": self["typed"],
            "valid replies": self["valid"],
            "untyped/no reply": self["untyped"] + self["no reply"],
            "internal errors": self["internal"],
            "stored changes": self["stored"],
        }


async def _outcome(nc: NATS, target: Target, body: bytes, hs: dict[str, str]) -> tuple[str, str]:
    """What one request got: `typed`, `valid`, `internal`, `untyped` or `no reply`, and why."""
    try:
        reply = await nc.request(target.subject, body, timeout=REPLY_TIMEOUT, headers=hs)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        return "no reply", type(exc).__name__
    if reply.headers and h.ERROR in reply.headers:
        try:
            info = ERROR_DECODER.decode(reply.data).error
        except msgspec.DecodeError as exc:
            return "untyped", f"error body does not decode: {exc}"
        if info.code != reply.headers[h.ERROR] or not info.code:
            return "untyped", f"header {reply.headers[h.ERROR]!r} but body code {info.code!r}"
        if info.code == "internal":
            return "internal", info.message
        return "typed", info.code
    try:
        msgspec.json.decode(reply.data, type=target.reply)
    except msgspec.DecodeError as exc:
        return "untyped", f"reply is not a {target.reply.__name__}: {exc}"
    return "valid", ""


def _served_subjects() -> set[str]:
    """Request/reply subjects named in `subjects.py`: each must be answered by some service."""
    return {
        value
        for name, value in vars(subjects).items()
        if name.isupper()
        and isinstance(value, str)
        and value.startswith(subjects.PREFIX + ".")
        and not value.endswith(">")
        and "{" not in value
        and value != subjects.MEMORY_WRITES
    }


async def test_every_subject_answers_hostile_requests_with_a_typed_error_or_a_valid_reply(
    stack: Stack, nats_server: SecuredNats, nc: NATS, chaos_report: ChaosReport
) -> None:
    # The auth service answers whoami from its own account; the services' account imports it.
    found = targets(stack, extra=[nats_server.auth])
    enumerated = {t.subject for t in found}
    assert _served_subjects() <= enumerated, _served_subjects() - enumerated
    js = nc.jetstream()
    problems: list[str] = []
    covered: set[str] = set()
    for target in found:
        # The fuzz may have deleted it: each subject starts with alice's "s1" there.
        await nc.request(subjects.SESSIONS_IMPORT, S1_IMPORT, timeout=10, headers=ALICE)
        await _settle(js, stack, await stored_state(js, stack))
        tally = Tally()
        for body, hs in draw_cases(target.request, PAYLOADS, api=target.api):
            before = await stored_state(js, stack)
            outcome, why = await _outcome(nc, target, body, hs)
            after = await stored_state(js, stack)
            tally["payloads"] += 1
            tally[outcome] += 1
            if outcome not in ("typed", "valid"):
                problems.append(f"{target.subject}: {outcome} ({why}) for {body[:200]!r} {hs}")
            diff = changed(before, after)
            if diff and (outcome != "valid" or target.subject not in WRITES):
                tally["stored"] += 1
                problems.append(f"{target.subject}: {outcome} changed {diff} for {body[:200]!r}")
            elif outcome == "valid":
                # An accepted request may finish storing in the background (usage counters):
                # let it land before the next request is held to "changes nothing".
                await _settle(js, stack, after)
        covered.add(target.subject)
        chaos_report.record("Fuzz", tally.row(target.subject))

    assert covered == enumerated
    assert not problems, "\n".join(problems[:20])
    await _assert_every_service_still_answers(nc)


async def test_hostile_run_requests_each_end_in_a_typed_run_failed_or_a_completed_run(
    stack: Stack, nc: NATS, chaos_report: ChaosReport
) -> None:
    js = nc.jetstream()
    cases = draw_cases(RunRequest, RUNS, api=True)
    finals: dict[str, asyncio.Future[RunCompleted | RunFailed]] = {}
    loop = asyncio.get_running_loop()

    async def on_event(msg: object) -> None:
        event = RUN_EVENT_DECODER.decode(msg.data)  # type: ignore[attr-defined]
        future = finals.get(event.run_id)
        if isinstance(event, RunCompleted | RunFailed) and future and not future.done():
            future.set_result(event)

    subscription = await nc.subscribe(subjects.EVENTS_ALL, cb=on_event)
    before = await stored_state(js, stack)
    for index, (body, hs) in enumerate(cases):
        run_id = f"fz-{index}"
        body, agent = _with_run_id(body, run_id)
        finals[run_id] = loop.create_future()
        # Every fourth request goes to an agent subject of more than one token.
        subject = subjects.runs(f"{agent}.x" if index % 4 == 3 else agent)
        await js.publish(subject, body, headers={**hs, h.MSG_ID: run_id})
    for msg_id in UNUSABLE_RUN_IDS:
        # No events subject can carry these: the request is only failed, logged and acked.
        await js.publish(subjects.runs("travel"), b"{", headers={h.MSG_ID: msg_id})
    tally, problems = Tally(), []
    try:
        async with asyncio.timeout(90):
            done = await asyncio.gather(*finals.values())
    except TimeoutError:
        done = [f.result() for f in finals.values() if f.done()]
        problems.append(f"{len(finals) - len(done)} run requests got no final event")
    finally:
        await subscription.unsubscribe()
    after = await _settle(js, stack, await stored_state(js, stack))
    for event in done:
        tally["payloads"] += 1
        if isinstance(event, RunCompleted):
            tally["valid"] += 1
        elif event.error.code == "internal":
            tally["internal"] += 1
            problems.append(f"{event.run_id}: internal error {event.error.message}")
        else:
            tally["typed"] += 1
    tally["no reply"] += len(finals) - len(done)
    allowed = RUN_QUEUE_STORES if not tally["valid"] else None
    if allowed is not None and (diff := set(changed(before, after)) - allowed):
        tally["stored"] += 1
        problems.append(f"refused run requests changed {sorted(diff)}")
    chaos_report.record("Fuzz", tally.row(subjects.RUNS_TEMPLATE))

    assert not problems, "\n".join(problems)
    # The gateway still runs a valid request after all that.
    events = await publish_and_collect(nc, "fz-after", raw_request("fz-after", "Weather in Perth?"))
    assert events[-1]["type"] == "run.completed"
    await _assert_every_service_still_answers(nc)


async def _settle(js: JetStreamContext, stack: Stack, state: State) -> State:
    """Wait until what accepted requests store in the background has landed: the router's
    usage ledger (flushed now rather than at its interval), then anything still moving."""
    await stack.services["model_router"].ledger.flush()  # type: ignore[attr-defined]

    async def unchanged() -> bool:
        nonlocal state
        latest = await stored_state(js, stack)
        same, state = latest == state, latest
        return same

    with contextlib.suppress(AssertionError):
        await eventually(unchanged, 2.0, interval=0.05)
    return state


def _with_run_id(body: bytes, run_id: str) -> tuple[bytes, str]:
    """The body with a usable run id replaced by `run_id` (so its events can be told apart),
    and the agent subject to publish on: the body's agent when it is subject-safe."""
    try:
        shaped = json.loads(body)
    except ValueError:
        return body, "travel"
    if not isinstance(shaped, dict):
        return body, "travel"
    if isinstance(shaped.get("run_id"), str) and is_identifier(shaped["run_id"]):
        shaped["run_id"] = run_id
        body = json.dumps(shaped).encode()
    agent = shaped.get("agent")
    return body, agent if isinstance(agent, str) and is_identifier(agent) else "travel"


async def _assert_every_service_still_answers(nc: NATS) -> None:
    assert set(VALID) == set(SERVICE_NAMES)
    for name, (subject, body) in VALID.items():
        reply = await nc.request(f"$SRV.PING.{name}", b"", timeout=5)
        assert json.loads(reply.data)["name"] == name
        reply = await nc.request(subject, json.dumps(body).encode(), timeout=10, headers=ALICE)
        assert not (reply.headers and h.ERROR in reply.headers), (name, reply.data)
