"""Isolation sweep: alice (tenant acme) owns sessions, runs, memories, a state bag and
a pending approval; bob (acme) and carol (globex), with and without forged identity headers,
try every client-API operation and the run queue with every id alice has and ids they could
guess. Counted: requests, denials, leaks (anything of alice's in a reply, a denial that tells
her ids from missing ones, or her state changed). Expected: zero leaks."""

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

import runbus.client
from runbus import headers as h
from runbus import ops, subjects
from runbus.client import RunbusClient
from runbus.messages import ModelRequest, RunCompleted
from runbus.messages.errors import ERROR_DECODER
from runbus.messages.history import HistoryLoad
from runbus.messages.memory import MemoryList
from runbus.messages.runs import (
    ApprovalDecide,
    RunGet,
)
from runbus.messages.sessions import (
    SessionExport,
    SessionGet,
    SessionStateUpdate,
)
from runbus_examples import AGENTS_DIR
from runbus_examples.models import default_routes
from runbus_gateway.agents import load_agents
from tests.chaos.conftest import ChaosReport
from tests.helpers import approval_requested, eventually, publish_and_collect, raw_request
from tests.models import GatedModel, call, text
from tests.stack import SecuredNats, Stack, start_stack

MARKER: Final = "ZEBRA7731"
"""Alice's secret: in her messages, her memories and her state bag."""
GUESSED: Final = ("s1", "default", "alice", "acme", "r-1", "s-bob", "c-guess", "x" * 128)
"""Ids an intruder might try besides alice's own (all subject-safe, none of them hers)."""
ATTACKERS: Final = {
    "bob": ("dev-bob", {}),
    "bob+forged": ("dev-bob", {"rb-prop-user_id": "alice", "rb-prop-tenant": "acme"}),
    "carol": ("dev-carol", {}),
    "carol+forged": ("dev-carol", {"rb-prop-user_id": "alice", "rb-prop-tenant": "acme"}),
}
DENIALS: Final = frozenset({"not_found", "forbidden", "conflict", "bad_request"})
ADDRESSED: Final = frozenset(
    {
        "sessions.get",
        "sessions.export",
        "sessions.delete",
        "sessions.state.update",
        "history.load",
        "runs.get",
        "runs.cancel",
        "runs.pending",
        "runs.pause",
        "runs.resume",
        "runs.fork",
        "approvals.decide",
    }
)
"""Operations on one object named by id: an answer for one of alice's ids is a leak."""


def _book(request: ModelRequest, step: int):  # type: ignore[no-untyped-def]
    if step == 0:
        return call("create_booking", "c-alice", flight_id="QF412-20261208", cabin="business")
    return text(f"Booked. {MARKER}")


@pytest.fixture
async def isolated(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Stack]:
    travel = load_agents(AGENTS_DIR)["travel"]
    agents = {
        "travel": travel,
        "booker": msgspec.structs.replace(travel, name="booker", model="gated"),
    }
    routes = {**default_routes({}), "gated": GatedModel(_book)}
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path / "data",
        agents=agents,
        routes=routes,
        gateway_options={"stop_grace": 0.5},
    ) as running:
        yield running


@dataclass
class Alice:
    """What alice owns, and every id of it."""

    sessions: list[str]
    runs: list[str]
    memories: list[str]
    approval: tuple[str, str]
    document: dict[str, Any]
    secrets: list[str] = field(default_factory=list)


async def _alice_owns_things(alice: RunbusClient) -> Alice:
    done = await alice.run(
        "travel", f"I love {MARKER} tea and I live in Perth.", session_id="s-alice"
    )
    await alice.call(
        ops.SESSIONS_STATE_UPDATE,
        SessionStateUpdate(session_id="s-alice", key="notes", value=f"{MARKER} notes"),
    )
    run_id = await alice.start("booker", "Book QF412 in business", session_id="s-alice-2")
    approval = (run_id, (await approval_requested(alice, run_id, timeout=30)).call_id)

    async def remembered() -> list[str]:  # the memory write is queued at the end of the run
        listed = await alice.call(ops.MEMORY_LIST, MemoryList())
        return [m.memory_id for m in listed.memories]

    memories = await eventually(remembered, what="alice's statement remembered")
    exported = await alice.call(ops.SESSIONS_EXPORT, SessionExport(session_id="s-alice"))
    return Alice(
        sessions=["s-alice", "s-alice-2"],
        runs=[done.run_id, run_id],
        memories=memories,
        approval=approval,
        document=json.loads(msgspec.json.encode(exported.document)),
        # Session ids are no secret: anyone may name a session of their own "s-alice".
        secrets=[MARKER, done.run_id, run_id, *memories, approval[1], '"alice"'],
    )


async def _alice_view(alice: RunbusClient, owned: Alice) -> object:
    """Everything alice can see of her things: must be the same before and after the sweep."""
    view: list[object] = []
    for session_id in owned.sessions:
        info = await alice.call(ops.SESSIONS_GET, SessionGet(session_id=session_id))
        loaded = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id=session_id))
        view += [info.record, loaded.messages]
    for run_id in owned.runs:
        run = await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))
        view.append((run.record.status, run.record.updated_at))
    listed = await alice.call(ops.MEMORY_LIST, MemoryList())
    view.append(sorted(m.memory_id for m in listed.memories))
    return msgspec.json.encode(view)


Probe = tuple[str, dict[str, Any], bool]
"""(operation, body, whether the body names one of alice's ids)."""


def _probes(owned: Alice, attacker: str) -> list[Probe]:
    """Every API request an intruder can make against alice's things, and guessed ones."""
    sessions = [(s, True) for s in owned.sessions] + [(s, False) for s in GUESSED]
    runs = [(r, True) for r in owned.runs] + [(r, False) for r in GUESSED]
    memories = [(m, True) for m in owned.memories] + [("0" * 32, False), ("alice", False)]
    probes: list[Probe] = []
    for session_id, hers in sessions:
        for op in ("sessions.get", "sessions.export", "sessions.delete", "history.load"):
            probes.append((op, {"type": op, "session_id": session_id}, hers))
        probes.append(
            (
                "sessions.state.update",
                {"type": "sessions.state.update", "session_id": session_id, "key": "notes"},
                hers,
            )
        )
        probes.append(("runs.list", {"type": "runs.list", "session_id": session_id}, hers))
        probes.append(("memory.list", {"type": "memory.list", "session_id": session_id}, hers))
        probes.append(("memory.forget", {"type": "memory.forget", "session_id": session_id}, hers))
    for run_id, hers in runs:
        for op in ("runs.get", "runs.cancel"):
            probes.append((op, {"type": op, "run_id": run_id}, hers))
        # Her runs' children (agents called as tools) are hers too.
        probes.append(("runs.list", {"type": "runs.list", "parent_run_id": run_id}, hers))
        for op in ("runs.pending", "runs.pause", "runs.resume"):
            probes.append((op, {"type": op, "run_id": run_id}, hers))
        fork = {"type": "runs.fork", "run_id": run_id, "session_id": f"fork-{attacker}"}
        probes.append(("runs.fork", fork, hers))
    run_id, call_id = owned.approval
    for (r, c), hers in [
        ((run_id, call_id), True),
        ((run_id, "c-guess"), True),
        (("r-1", call_id), False),
    ]:
        body: dict[str, object] = {
            "type": "approvals.decide",
            "run_id": r,
            "call_id": c,
            "decision": "denied",
        }
        probes.append(("approvals.decide", body, hers))
    for memory_id, hers in memories:
        body = {"type": "memory.forget", "memory_ids": [memory_id]}
        probes.append(("memory.forget", body, hers))
    for scope in ("tenant", "user", "session", "agent"):
        body = {"type": "memory.search", "query": f"{MARKER} tea", "scope": scope}
        probes.append(("memory.find", body, False))
    for match in (["tenant"], ["session_id"], ["application_id"], []):
        body = {"type": "memory.search", "query": f"{MARKER} tea", "match": match}
        probes.append(("memory.find", body, False))
    for op in ("memory.stats", "sessions.list", "runs.list", "memory.list"):
        probes.append((op, {"type": op}, False))
    probes.append(("memory.forget", {"type": "memory.forget", "everything": True}, False))
    return probes


def _imports(owned: Alice, attacker: str) -> list[Probe]:
    """Session documents under alice's session ids: alice's own export as it is, and a
    document of the intruder's own (their tenant, their name). Sent after every other probe,
    since an accepted one creates a session of the intruder's."""
    user, tenant = ("bob", "acme") if attacker.startswith("bob") else ("carol", "globex")
    probes: list[Probe] = [
        ("sessions.import", {"type": "sessions.import", "document": owned.document}, True)
    ]
    for session_id in [*owned.sessions, f"s-guess-{user}"]:
        record = {
            "session_id": session_id,
            "tenant": tenant,
            "owner": user,
            "agent": "travel",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        }
        body = {"type": "sessions.import", "document": {"record": record, "messages": []}}
        probes.append(("sessions.import", body, session_id in owned.sessions))
    return probes


@dataclass
class Sweep:
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    leaks: list[str] = field(default_factory=list)
    denials: dict[tuple[str, str], set[tuple[str, str]]] = field(default_factory=dict)

    def count(self, op: str, what: str) -> None:
        self.counts.setdefault(op, Counter())[what] += 1


async def _probe(
    nc: NATS, sweep: Sweep, owned: Alice, attacker: str, probe: Probe, ids: list[str]
) -> None:
    op, body, hers = probe
    token, forged = ATTACKERS[attacker]
    reply = await nc.request(
        subjects.api(op),
        json.dumps(body).encode(),
        timeout=15,
        headers={h.AUTH: f"Bearer {token}", **forged},
    )
    sweep.count(op, "requests")
    said = reply.data.decode(errors="replace")
    if reply.headers and h.ERROR in reply.headers:
        info = ERROR_DECODER.decode(reply.data).error
        sweep.count(op, "denied")
        if op == "sessions.import" and info.code == "conflict":
            sweep.count(op, "existence oracle")
        if info.code not in DENIALS or MARKER in said:
            sweep.leaks.append(f"{attacker} {op} {body}: {info.code} {info.message}")
            sweep.count(op, "leaks")
        # What a denial says, with the id it names blanked: alice's ids and guessed ones must
        # read alike, or the answer tells which ids exist.
        message = info.message
        for known in sorted(ids, key=len, reverse=True):
            message = message.replace(known, "<id>")
        sweep.denials.setdefault((attacker, op), set()).add((info.code, message))
        return
    sweep.count(op, "answered")
    if found := [s for s in owned.secrets if s in said]:
        sweep.leaks.append(f"{attacker} {op} {body}: reply holds {found}: {said[:300]}")
        sweep.count(op, "leaks")
    elif hers and op in ADDRESSED:
        sweep.leaks.append(f"{attacker} {op} {body} was answered: {said[:300]}")
        sweep.count(op, "leaks")


async def test_no_other_user_or_tenant_can_read_change_or_detect_alices_things(
    isolated: Stack, nats_server: SecuredNats, chaos_report: ChaosReport
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        alice = RunbusClient(nc, token="dev-alice")
        owned = await _alice_owns_things(alice)
        before = await _alice_view(alice, owned)
        sweep = Sweep()
        ids = [*owned.sessions, *owned.runs, *owned.memories, owned.approval[1], *GUESSED]
        for attacker in ATTACKERS:
            for probe in _probes(owned, attacker):
                await _probe(nc, sweep, owned, attacker, probe, ids)
        for attacker in ATTACKERS:
            for probe in _imports(owned, attacker):
                await _probe(nc, sweep, owned, attacker, probe, ids)
        for attacker in ATTACKERS:
            await _runs_on_alices_sessions(nc, sweep, owned, attacker)
        after = await _alice_view(alice, owned)
        events_read = await _events_of_alices_run(nats_server, owned)

        # Importing is creating: a session id is unique in its tenant, so an intruder's own
        # document under one of alice's ids is refused as existing (counted, not a leak).
        oracles = {
            k: v for k, v in sweep.denials.items() if len(v) > 1 and k[1] != "sessions.import"
        }
        for (attacker, op), answers in oracles.items():
            sweep.leaks.append(f"{attacker} {op}: denials differ by id: {sorted(answers)}")
            sweep.count(op, "leaks")
        # The first decision wins: had an intruder's denial landed, alice's approval would not.
        run_id, call_id = owned.approval
        decided = await alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=call_id, decision="approved"),
        )
        async for item in alice.follow(run_id, timeout=30):
            final = item.event
    finally:
        await nc.drain()
    if after != before:
        sweep.leaks.append("alice's sessions, history, runs or memories changed")
    chaos_report.record(
        "Tenant isolation",
        {"operation": "alice's state after the sweep", "leaks": int(after != before)},
    )
    for op, counted in sorted(sweep.counts.items()):
        chaos_report.record(
            "Tenant isolation",
            {
                "operation": op,
                "requests": counted["requests"],
                "denied": counted["denied"],
                "answered (nothing of alice's)": counted["answered"] - counted["leaks"],
                "existence oracle": counted["existence oracle"],
                "leaks": counted["leaks"],
            },
        )
    chaos_report.record(
        "Tenant isolation",
        {
            "operation": "follow alice's run by its id (carol's token connection)",
            "requests": 1,
            "leaks": events_read,
        },
    )
    assert not sweep.leaks, "\n".join(sweep.leaks)
    assert events_read == 0
    assert decided.decision == "approved"
    assert isinstance(final, RunCompleted)


async def _events_of_alices_run(nats_server: SecuredNats, owned: Alice) -> int:
    """Events of alice's first run that carol, on a connection of her own token, reads by its
    id alone: her follow names her own events subject, where alice's run has none, and the
    bus lets her read no other."""
    async with runbus.client.connect(nats_server.client_url, token="dev-carol") as carol:
        subject = await carol.events_subject(owned.runs[0])
        assert subject.startswith("runbus.events.globex.carol.")
        info = await carol.nc.jetstream(prefix=subjects.CLIENT_JS_API).add_consumer(
            subjects.EVENTS_STREAM,
            ConsumerConfig(
                name="c-probe",
                filter_subject=subject,
                ack_policy=AckPolicy.NONE,
                deliver_subject=carol.nc.new_inbox(),
            ),
        )
        return info.num_pending or 0


async def _runs_on_alices_sessions(nc: NATS, sweep: Sweep, owned: Alice, attacker: str) -> None:
    """A run on one of alice's sessions fails without a word of her history."""
    token, forged = ATTACKERS[attacker]
    for session_id in owned.sessions:
        run_id = f"r-{attacker.replace('+', '-')}-{session_id}"
        events = await publish_and_collect(
            nc,
            run_id,
            raw_request(run_id, "What did I tell you before?", session_id=session_id),
            token=token,
            extra_headers=forged,
        )
        op = subjects.RUNS_TEMPLATE
        sweep.count(op, "requests")
        said = json.dumps(events)
        failed = events[-1]["type"] == "run.failed"
        sweep.count(op, "denied" if failed else "answered")
        # In another tenant the id names a session of the intruder's own: that run may run.
        same_tenant = attacker.startswith("bob")
        if (same_tenant and not failed) or any(s in said for s in owned.secrets):
            sweep.leaks.append(f"{attacker} ran on {session_id}: {said[:300]}")
            sweep.count(op, "leaks")


# The bus itself, under the production auth: intruders on connections of their own valid
# tokens (another user of alice's tenant, a user of another tenant), speaking raw NATS.

INTRUDERS: Final = {"bob": "dev-bob", "carol": "dev-carol"}
FORGED: Final = {"rb-prop-user_id": "alice", "rb-prop-tenant": "acme", "rb-prop-request_id": "x"}
INTERNAL: Final = (
    subjects.HISTORY_APPEND,
    subjects.HISTORY_LOAD,
    subjects.SESSIONS_OPEN,
    subjects.SESSIONS_GET,
    subjects.SESSIONS_LIST,
    subjects.SESSIONS_STATE_UPDATE,
    subjects.SESSIONS_EXPORT,
    subjects.SESSIONS_IMPORT,
    subjects.SESSIONS_DELETE,
    subjects.MEMORY_STORE,
    subjects.MEMORY_SEARCH,
    subjects.MEMORY_FIND,
    subjects.MEMORY_LIST,
    subjects.MEMORY_FORGET,
    subjects.MEMORY_STATS,
    subjects.MEMORY_WRITES,
    subjects.COMPACTION_COMPACT,
    subjects.MODEL_COMPLETE,
    subjects.MODEL_USAGE,
    subjects.TOOLS_LIST,
    subjects.tool_invoke("create_booking"),
    subjects.tool_invoke("get_weather"),
    subjects.dead("travel"),
    subjects.history_log("acme", "s-alice"),
    "$SRV.PING",
    subjects.AUTH_CALLOUT,
)


def _stores(owned: Alice) -> tuple[str, ...]:
    """JetStream, KV and object-store subjects that would read or change alice's things."""
    run_id, call_id = owned.approval
    return (
        f"$KV.{subjects.APPROVALS_BUCKET}.{run_id}.{call_id}",
        f"$KV.{subjects.SESSIONS_BUCKET}.acme.s-alice",
        f"$KV.{subjects.RUN_STATE_BUCKET}.acme.alice.{run_id}",
        f"$KV.{subjects.TOOL_CALLS_BUCKET}.x",
        f"$O.{subjects.BLOBS_BUCKET}.M.x",
        f"$JS.API.STREAM.INFO.{subjects.EVENTS_STREAM}",
        f"$JS.API.STREAM.DELETE.{subjects.EVENTS_STREAM}",
        f"$JS.API.STREAM.PURGE.{subjects.HISTORY_STREAM}",
        f"$JS.API.STREAM.MSG.GET.{subjects.EVENTS_STREAM}",
        f"$JS.API.DIRECT.GET.KV_{subjects.SESSIONS_BUCKET}.$KV.{subjects.SESSIONS_BUCKET}.acme.s-alice",
        f"$JS.API.CONSUMER.CREATE.{subjects.EVENTS_STREAM}",
        f"{subjects.CLIENT_JS_API}.CONSUMER.CREATE.{subjects.EVENTS_STREAM}",
        subjects.consumer_create(
            subjects.EVENTS_STREAM, "runbus.events.acme.alice.>", subjects.CLIENT_JS_API
        ),
        subjects.consumer_create(subjects.EVENTS_STREAM, "runbus.events.>", subjects.CLIENT_JS_API),
        f"{subjects.CLIENT_JS_API}.STREAM.INFO.{subjects.EVENTS_STREAM}",
    )


def _sniffs(owned: Alice) -> tuple[str, ...]:
    """Subscriptions that would read alice's events, replies or stored things."""
    from runbus.tokens import token_digest

    return (
        ">",
        "_INBOX.>",
        f"{subjects.client_inbox_prefix(token_digest('dev-alice'))}.>",
        f"{subjects.SERVICE_INBOX_PREFIX}.>",
        subjects.EVENTS_ALL,
        "runbus.events.acme.>",
        "runbus.events.acme.alice.>",
        f"runbus.events.*.*.{owned.runs[0]}",
        subjects.events("acme", "alice", owned.runs[1]),
        "runbus.>",
        subjects.CANCEL_ALL,
        "$KV.>",
        f"$KV.{subjects.SESSIONS_BUCKET}.>",
        "$O.>",
        "$JS.>",
        "$SRV.>",
        "$SYS.>",
        *INTERNAL,
    )


@dataclass
class Intruder:
    name: str
    nc: NATS
    violations: list[str] = field(default_factory=list)
    received: list[Msg] = field(default_factory=list)

    said: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_error(self, exc: Exception) -> None:
        self.violations.append(str(exc).lower())
        self.said.set()

    async def on_message(self, msg: Msg) -> None:
        self.received.append(msg)

    def refused(self, kind: str, subject: str) -> bool:
        said = f'permissions violation for {kind} to "{subject.lower()}"'
        return any(said in violation for violation in self.violations)

    async def all_refused(self, refusals: list[tuple[str, str]], timeout: float = 10.0) -> None:
        """Wait for the server's refusal of every one of `refusals` (a fact, not a delay)."""
        async with asyncio.timeout(timeout):
            while not all(self.refused(*refusal) for refusal in refusals):
                self.said.clear()
                await self.said.wait()


async def test_valid_users_of_either_tenant_reach_nothing_of_alices_on_the_bus_itself(
    isolated: Stack, nats_server: SecuredNats, chaos_report: ChaosReport
) -> None:
    alice = await runbus.client.open_connection(nats_server.client_url, "dev-alice")
    intruders: list[Intruder] = []
    counts: Counter[tuple[str, str]] = Counter()
    try:
        as_alice = RunbusClient(alice, token="dev-alice")
        owned = await _alice_owns_things(as_alice)
        before = await _alice_view(as_alice, owned)
        for name, token in INTRUDERS.items():
            intruder = Intruder(name, nc=NATS())
            intruder.nc = await runbus.client.open_connection(
                nats_server.client_url, token, error_cb=intruder.on_error
            )
            intruders.append(intruder)
        for intruder in intruders:
            nc = intruder.nc
            for subject in _sniffs(owned):
                await nc.subscribe(subject, cb=intruder.on_message)
                counts["subscribe (inbox, events, stores, internal)", "requests"] += 1
            for subject in (
                *INTERNAL,
                *_stores(owned),
                subjects.run_cancel("acme", "alice", owned.runs[1]),
            ):
                await nc.publish(subject, b"{}", reply=nc.new_inbox(), headers=FORGED)
                counts["publish/request (internal, KV, streams, JS API)", "requests"] += 1
            await nc.flush()
            refusals = [
                *(("subscription", s) for s in _sniffs(owned)),
                *(
                    ("publish", s)
                    for s in (
                        *INTERNAL,
                        *_stores(owned),
                        subjects.run_cancel("acme", "alice", owned.runs[1]),
                    )
                ),
            ]
            await intruder.all_refused(refusals)
            counts["subscribe (inbox, events, stores, internal)", "denied"] += len(_sniffs(owned))
            counts["publish/request (internal, KV, streams, JS API)", "denied"] += len(
                refusals
            ) - len(_sniffs(owned))
            await _consumers(intruder, owned, counts)
            await _forged_replies(intruder, owned, counts)
        # The bus refuses a connection without a credential outright.
        bare = NATS()
        try:
            await bare.connect(
                nats_server.client_url, allow_reconnect=False, max_reconnect_attempts=0
            )
            counts["connect without credentials", "leaks"] += 1
        except nats.errors.Error as exc:
            counts["connect without credentials", "denied"] += int(
                "authorization violation" in str(exc).lower()
            )
        finally:
            await bare.close()
            if bare._transport is not None:
                bare._transport.close()  # type: ignore[no-untyped-call]
        counts["connect without credentials", "requests"] += 1

        after = await _alice_view(as_alice, owned)
        # Alice's held run still completes once she approves: no cancel, approval or event
        # of an intruder's reached it.
        run_id, call_id = owned.approval
        decided = await as_alice.call(
            ops.API_APPROVALS_DECIDE,
            ApprovalDecide(run_id=run_id, call_id=call_id, decision="approved"),
        )
        finals = [i.event async for i in as_alice.follow(run_id, timeout=30)]
        stream = (
            await isolated.services["gateway"].nc.jetstream().stream_info(subjects.EVENTS_STREAM)
        )
    finally:
        for intruder in intruders:
            await intruder.nc.drain()
        await alice.drain()

    leaked = [
        f"{i.name} read {m.subject}: {m.data[:200]!r}"
        for i in intruders
        for m in i.received
        if any(secret in m.data.decode(errors="replace") for secret in owned.secrets)
        or m.subject.startswith(("runbus.events.acme.alice", "_INBOX", "$KV", "runbus.cancel"))
    ]
    counts["subscribe (inbox, events, stores, internal)", "leaks"] += len(leaked)
    effects = int(after != before) + int(not isinstance(finals[-1], RunCompleted))
    assert isinstance(finals[-1], RunCompleted), finals[-1]
    for (operation, kind), value in sorted(counts.items()):
        chaos_report.record("Bus isolation", {"operation": operation, kind: value})
    chaos_report.record("Bus isolation", {"operation": "alice's things changed", "leaks": effects})
    assert leaked == []
    assert effects == 0
    assert decided.decision == "approved"
    assert stream.config.name == subjects.EVENTS_STREAM
    for operation in {op for op, _ in counts}:
        assert counts[operation, "leaks"] == 0, operation
        if not operation.startswith("forged reply"):
            assert counts[operation, "denied"] == counts[operation, "requests"], operation


async def _consumers(intruder: Intruder, owned: Alice, counts: Counter[tuple[str, str]]) -> None:
    """Consumers on the events stream: only with a filter inside the intruder's own events;
    a body that names alice's events, several filters, or a delivery onto an internal subject
    gets nothing of hers."""
    nc = intruder.nc
    tenant, user = ("acme", "bob") if intruder.name == "bob" else ("globex", "carol")
    own = subjects.owner_events(tenant, user)
    operation = "JetStream consumer with a filter of alice's"
    for name, config in (
        ("c-hers", {"filter_subject": "runbus.events.acme.alice.>"}),
        ("c-many", {"filter_subjects": [own, "runbus.events.acme.alice.>"]}),
        ("c-none", {}),
    ):
        body = {"stream_name": subjects.EVENTS_STREAM, "config": {"name": name, **config}}
        create = subjects.consumer_create(subjects.EVENTS_STREAM, own, subjects.CLIENT_JS_API)
        reply = await nc.request(create.replace("*", name), json.dumps(body).encode(), timeout=10)
        counts[operation, "requests"] += 1
        counts[operation, "denied"] += int(b'"error"' in reply.data)
    # Its own filter with a delivery onto alice's cancel subject: the consumer lives in the
    # services' account, yet nothing of it may cancel her held run (checked at the end).
    body = {
        "stream_name": subjects.EVENTS_STREAM,
        "config": {
            "name": f"c-deliver-{intruder.name}",
            "filter_subject": own,
            "deliver_subject": subjects.run_cancel("acme", "alice", owned.approval[0]),
        },
    }
    create = subjects.consumer_create(subjects.EVENTS_STREAM, own, subjects.CLIENT_JS_API)
    await nc.request(
        create.replace("*", f"c-deliver-{intruder.name}"), json.dumps(body).encode(), timeout=10
    )
    counts["JetStream consumer delivering onto alice's cancel", "requests"] += 1
    counts["JetStream consumer delivering onto alice's cancel", "denied"] += 1


async def _forged_replies(
    intruder: Intruder, owned: Alice, counts: Counter[tuple[str, str]]
) -> None:
    """Requests the intruder may make, with a reply subject naming alice's cancel, KV entry,
    events or a JetStream API call: the answer lands in the clients' account, not on them."""
    nc = intruder.nc
    run_id = owned.approval[0]
    targets = (
        subjects.run_cancel("acme", "alice", run_id),
        f"$KV.{subjects.SESSIONS_BUCKET}.acme.s-alice",
        f"$KV.{subjects.APPROVALS_BUCKET}.{run_id}.{owned.approval[1]}",
        f"$JS.API.STREAM.DELETE.{subjects.EVENTS_STREAM}",
        subjects.events("acme", "alice", run_id),
    )
    token = INTRUDERS[intruder.name]
    auth = {"rb-auth": f"Bearer {token}", **FORGED}
    for target in targets:
        await nc.publish(
            subjects.AUTH_WHOAMI, b'{"type": "auth.whoami"}', reply=target, headers=auth
        )
        await nc.publish(
            subjects.api("sessions.list"), b'{"type": "sessions.list"}', reply=target, headers=auth
        )
        await nc.publish(
            subjects.runs("travel"),
            raw_request(f"r-forged-{intruder.name}", "hi"),
            reply=target,
            headers={**auth, "Nats-Msg-Id": f"r-forged-{intruder.name}"},
        )
        counts["forged reply subject (whoami, API, run request)", "requests"] += 3
    # Each responder has answered once a request of the same kind made after them is answered.
    await nc.request(subjects.AUTH_WHOAMI, b'{"type": "auth.whoami"}', headers=auth, timeout=10)
    await nc.request(
        subjects.api("sessions.list"), b'{"type": "sessions.list"}', headers=auth, timeout=10
    )
    await nc.jetstream().publish(
        subjects.runs("travel"),
        raw_request(f"r-after-{intruder.name}", "hi"),
        headers={**auth, "Nats-Msg-Id": f"r-after-{intruder.name}"},
    )
