"""The chaos suite's machinery: the six services as OS processes running a three-tool agent on
two models, a load of runs with disruptions at chosen points, and the counts read back from
the durable state (events stream, run records, history stream, booking ledger)."""

import asyncio
import contextlib
import json
import os
import random
import time
import tomllib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from runbus import subjects
from runbus.client import RunbusClient
from runbus.owners import Owner
from runbus.settings import load_settings
from runbus.supervisor import ProcessStack
from runbus_examples.scripted import ScriptedReply
from tests.chaos.ledger_tools import ledger_path
from tests.helpers import eventually, take_time
from tests.integration.model_provider import (
    LoopbackProvider,
    Reply,
    chunk,
    loopback,
    usage_chunk,
)
from tests.stack import service_url

AGENTS = ("chaos", "fresh")
"""The same three-tool run twice: `chaos` on the scripted model (call ids repeat on a redone
step), `fresh` on a loopback OpenAI-compatible provider that picks new call ids every time, as
a real model does, so a redone step would book again."""
TENANT, USER, TOKEN = "acme", "alice", "dev-alice"
ROOT = Path(__file__).resolve().parents[2]

AGENT_TOML = """
name = "{name}"
instructions = "You are a travel assistant."
model = "{model}"
tools = ["get_weather", "search_flights", "create_booking"]
max_iterations = 8
[memory]
enabled = true
store_user_statements = true
[compaction]
max_tokens = 8000
"""
# Every reply carries one word of text, so each model call streams exactly one delta with its
# step's message id: the deltas in the events stream count the model calls per step.
SCRIPT_TOML = """
[[chaos]]
text = "weather"
tool_calls = [{name = "get_weather", arguments = {city = "Sydney"}}]
[[chaos]]
text = "flights"
tool_calls = [{name = "search_flights", arguments = {origin = "Melbourne", destination = "Sydney", date = "2026-12-08"}}]
[[chaos]]
text = "booking"
tool_calls = [{name = "create_booking", arguments = {flight_id = "QF412-20261208"}}]
[[chaos]]
text = "booked"
"""  # noqa: E501
ROUTES_TOML = """
[backends.loopback]
base_url = "{base_url}"
[routes.fresh]
[[routes.fresh.targets]]
backend = "loopback"
model = "loopback-1"
retries = 0
"""
SCRIPT = msgspec.convert(tomllib.loads(SCRIPT_TOML), dict[str, list[ScriptedReply]])["chaos"]
STEPS = ("in0", "m0", "t0", "m1", "t1", "m2", "t2", "m3")
"""Message ids (after `<run_id>:`) a completed run leaves in its session's history."""
TERMINAL = ("run.completed", "run.failed")
REQUEST_TIMEOUT = "3"
"""Seconds per hop: a request caught in a killed replica fails after this, then the run is
retried; the default 30 s would make every kill cost half a minute."""


class _Event(msgspec.Struct):
    type: str
    run_id: str = ""
    message_id: str = ""
    error: dict[str, Any] | None = None
    result: dict[str, Any] | None = None


_EVENT = msgspec.json.Decoder(_Event)


@dataclass
class ChaosStack:
    stack: ProcessStack
    nc: NATS
    client: RunbusClient
    data: Path


def fresh_reply(request: dict[str, Any]) -> Reply:
    """The `fresh` model: the script's reply for this point of the turn (one word of text,
    then the step's tool call under a new random call id)."""
    messages = request["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    step = sum(1 for m in messages[last_user:] if m["role"] == "assistant")
    reply = SCRIPT[step]
    chunks = [chunk(content=reply.text)]
    for index, call in enumerate(reply.tool_calls):
        function = {"name": call.name, "arguments": json.dumps(call.arguments)}
        tool_call = {"index": index, "id": f"call_{uuid.uuid4().hex[:16]}", "type": "function"}
        chunks.append(chunk(tool_calls=[{**tool_call, "function": function}]))
    chunks.append(chunk(finish_reason="tool_calls" if reply.tool_calls else "stop"))
    chunks.append(usage_chunk(20, 5))
    return Reply(chunks=chunks)


@asynccontextmanager
async def fresh_model() -> AsyncIterator[LoopbackProvider]:
    async with loopback("fresh") as provider:
        # Nothing awaits between recording a request and asking for the default reply.
        provider.default = lambda: fresh_reply(provider.requests[-1])
        yield provider


@asynccontextmanager
async def chaos_stack(
    data: Path, *, replicas: dict[str, int], nats_url: str | None = None
) -> AsyncIterator[ChaosStack]:
    """The six services as processes (`replicas` per service), on `nats_url` or an embedded
    server of their own, with both agents. Each memory replica gets its own embedded shard
    (one shard cannot be shared between processes)."""
    async with contextlib.AsyncExitStack() as contexts:
        provider = await contexts.enter_async_context(fresh_model())
        yield await contexts.enter_async_context(
            _stack(data, replicas, nats_url, provider.base_url)
        )


@asynccontextmanager
async def _stack(
    data: Path, replicas: dict[str, int], nats_url: str | None, model_url: str
) -> AsyncIterator[ChaosStack]:
    (data / "agents").mkdir(parents=True)
    (data / "agents" / "chaos.toml").write_text(
        AGENT_TOML.format(name="chaos", model="scripted/chaos")
    )
    (data / "agents" / "fresh.toml").write_text(AGENT_TOML.format(name="fresh", model="fresh"))
    (data / "scripts.toml").write_text(SCRIPT_TOML)
    (data / "routes.toml").write_text(ROUTES_TOML.format(base_url=model_url))
    env = {
        "RUNBUS_DATA_DIR": str(data),
        "RUNBUS_AGENTS_DIR": str(data / "agents"),
        "RUNBUS_MODEL_SCRIPTS": str(data / "scripts.toml"),
        "RUNBUS_MODEL_ROUTES": str(data / "routes.toml"),
        "RUNBUS_TOOL_MODULES": "tests.chaos.ledger_tools",
        "RUNBUS_EMBEDDER": "hashing",
        "RUNBUS_LOG_LEVEL": "warning",
        "RUNBUS_LOG_FORMAT": "json",
        "RUNBUS_REQUEST_TIMEOUT": REQUEST_TIMEOUT,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if nats_url:
        env["RUNBUS_NATS_URL"] = nats_url
    saved = dict(os.environ)
    os.environ.update(env)
    # `make chaos` sets RUNBUS_CHAOS*; the services would refuse them as unknown settings.
    for variable in [v for v in os.environ if v.startswith("RUNBUS_CHAOS")]:
        del os.environ[variable]
    if not nats_url:
        os.environ.pop("RUNBUS_NATS_URL", None)
    try:
        stack = ProcessStack(
            load_settings(),
            replicas=replicas,
            nats_port=0,
            replica_env={
                f"memory#{i}": {"RUNBUS_DATA_DIR": str(data / f"memory-{i}")}
                for i in range(2, replicas.get("memory", 1) + 1)
            },
        )
        try:
            url = await stack.start(timeout=60)
        except BaseException:
            await _down(stack)
            raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        nc = await nats.connect(
            service_url(url, stack.data),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=_quiet,
        )
        try:
            yield ChaosStack(stack, nc, RunbusClient(nc, token=TOKEN), data)
        finally:
            await nc.close()
    finally:
        await _down(stack)


async def _down(stack: ProcessStack) -> None:
    # SIGKILL first: a gateway that drains after the other services are gone waits out its
    # stop timeout (25 s), and nothing here needs a clean stop.
    for label in stack.labels:
        await stack.kill(label)
    await stack.stop()


async def _quiet(error: Exception) -> None:
    """A NATS restart refuses reconnects for a moment: expected here, not worth a traceback."""


# -- the load ----------------------------------------------------------------------------


@dataclass
class Load:
    """`runs` runs, `in_flight` at a time, each in a session of its own, alternating between
    the two agents."""

    chaos: ChaosStack
    prefix: str
    runs: int
    in_flight: int = 4
    started: int = 0
    run_ids: list[str] = field(default_factory=list)
    _done: dict[str, asyncio.Event] = field(default_factory=dict)
    _progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    def run_id(self, index: int) -> str:
        return f"{self.prefix}-r{index:03d}"

    @staticmethod
    def session_id(run_id: str) -> str:
        prefix, _, index = run_id.rpartition("-r")
        return f"{prefix}-s{index}"

    async def run(self, timeout: float) -> None:
        """Start every run and wait until each has a final event (or `timeout` passes)."""
        self.run_ids = [self.run_id(i) for i in range(self.runs)]
        self._done = {run_id: asyncio.Event() for run_id in self.run_ids}
        slots = asyncio.Semaphore(self.in_flight)
        deadline = time.monotonic() + timeout
        # Fast path: the live events. After a NATS restart a final event may slip past the
        # resubscription, so the stream is also polled for runs that look unfinished.
        live = await self.chaos.nc.subscribe("runbus.events.*.*.*", cb=self._on_event)
        poller = asyncio.create_task(self._poll_stream())

        async def one(run_id: str) -> None:
            async with slots:
                async with self._progress:
                    self.started += 1
                    self._progress.notify_all()
                await self._publish(run_id, deadline)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done[run_id].wait(), deadline - time.monotonic())

        try:
            await asyncio.gather(*(one(run_id) for run_id in self.run_ids))
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await live.unsubscribe()

    def in_flight_now(self) -> int:
        """Runs started (being published or running) and not yet finished."""
        return self.started - sum(done.is_set() for done in self._done.values())

    async def reached(self, started: int) -> None:
        """Return once `started` runs have been started."""
        async with self._progress:
            await self._progress.wait_for(lambda: self.started >= started)

    async def _publish(self, run_id: str, deadline: float) -> None:
        # A publish during a NATS outage fails or loses its ack; the same run id again is
        # safe, JetStream keeps one copy.
        async def accepted() -> bool:
            await self.chaos.client.start(
                AGENTS[int(run_id.rpartition("-r")[2]) % len(AGENTS)],
                "I live in Perth. Book the cheapest flight.",
                session_id=self.session_id(run_id),
                run_id=run_id,
            )
            return True

        await eventually(
            accepted, max(0.0, deadline - time.monotonic()), retrying=(Exception,), interval=0.5
        )

    async def _on_event(self, msg: Msg) -> None:
        event = _EVENT.decode(msg.data)
        if event.type in TERMINAL and event.run_id in self._done:
            self._done[event.run_id].set()

    async def _poll_stream(self) -> None:
        js = self.chaos.nc.jetstream()
        while True:
            await take_time(2.0)  # the period of this fallback for missed final events
            for run_id, done in self._done.items():
                if done.is_set() or run_id not in self.run_ids[: self.started]:
                    continue
                with contextlib.suppress(Exception):
                    last = await js.get_last_msg(
                        subjects.EVENTS_STREAM, subjects.events(TENANT, USER, run_id)
                    )
                    if last.data and _EVENT.decode(last.data).type in TERMINAL:
                        done.set()


async def disrupt_at(
    load: Load, points: list[int], disruption: Callable[[], Awaitable[None]]
) -> list[int]:
    """Run `disruption` once the load has started each of `points` runs (plus a random
    fraction of a second, so it lands at a random moment of the runs in flight); how many
    runs were in flight at each."""
    in_flight = []
    for point in sorted(points):
        await load.reached(point)
        await take_time(random.uniform(0.0, 0.1))
        in_flight.append(load.in_flight_now())
        await disruption()
    return in_flight


def where(points: list[int], in_flight: list[int]) -> str:
    """`12 (4), 40 (3)`: the run # of each disruption and the runs in flight then."""
    return ", ".join(f"{p} ({n})" for p, n in zip(points, in_flight, strict=True))


def kill_points(runs: int, kills: int) -> list[int]:
    """Random points of the load, one in the first half of each of `kills` equal stretches
    (so a restarted replica is back before the next), none in the first or last two runs."""
    stretch = (runs - 4) / kills
    return [2 + int(i * stretch + random.uniform(0, stretch / 2)) for i in range(kills)]


# -- the counts --------------------------------------------------------------------------


@dataclass
class Counts:
    runs: int
    completed: int = 0
    failed: int = 0
    lost: int = 0
    duplicated: int = 0
    unsettled: int = 0
    """Run requests still in the queue (not acked) when the counting began."""
    retried: int = 0
    """Runs delivered more than once: the disruption cut into them."""
    records_off: int = 0
    """Runs whose record in RUNBUS_RUN_STATE does not say what the events say."""
    dup_side_effects: int = 0
    bookings_missing: int = 0
    """Completed runs whose booking never ran (the tool's outcome was reported unknown)."""
    dup_history: int = 0
    lost_history: int = 0
    orphan_calls: int = 0
    tool_errors: int = 0
    """Tool results that are errors, other than "outcome unknown" (a side-effecting call cut
    mid-way by a killed executor, counted as a missing booking): a call lost to a killed
    replica or a NATS restart is sent again, so the model must never read such an error."""
    model_calls: int = 0
    model_calls_repeated: int = 0
    """Model calls beyond one per step: each is a call a crash cut off before its reply was
    checkpointed (a repeat of a checkpointed step would also show as a history duplicate)."""
    redone_after_tools: int = 0
    """Model calls for a step whose tool results were already out (a `run.tool_result`
    earlier in the stream): the scripted model repeats its call ids, so the executor replays
    the recorded result; the `fresh` model's new call ids run those tools again."""
    failures: Counter[str] = field(default_factory=Counter)
    """`code: message` of the failed runs, for the assertion's message."""
    tool_error_texts: Counter[str] = field(default_factory=Counter)
    """The texts counted in `tool_errors`, for the assertion's message."""

    def problems(self) -> dict[str, int]:
        """The counters that must be zero (and completed == runs)."""
        return {
            "not completed": self.runs - self.completed,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "records off": self.records_off,
            "unsettled": self.unsettled,
            "duplicated side effects": self.dup_side_effects,
            "duplicated history": self.dup_history,
            "lost history": self.lost_history,
            "orphan tool calls": self.orphan_calls,
            "tool errors": self.tool_errors,
            "steps redone after their tools ran": self.redone_after_tools,
        }

    def row(self) -> dict[str, object]:
        return {
            "runs": self.runs,
            "completed": self.completed,
            "retried": self.retried,
            "failed": self.failed,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "dup. side effects": self.dup_side_effects,
            "dup. history": self.dup_history,
            "lost history": self.lost_history,
            "orphan calls": self.orphan_calls,
            "records off": self.records_off,
            "unsettled": self.unsettled,
            "bookings unknown": self.bookings_missing,
            "tool errors": self.tool_errors,
            "model calls (repeated)": f"{self.model_calls} ({self.model_calls_repeated})",
            "steps redone after their tools ran": self.redone_after_tools,
        }


async def settled(chaos: ChaosStack, timeout: float) -> int:
    """Wait until the run queue is empty (every request acked); how many are left after
    `timeout`. A run's final event can be out while its request is not yet acked: a NATS
    outage may swallow the ack or nak, and JetStream redelivers it after the ack wait."""
    js = chaos.nc.jetstream()
    left = -1

    async def empty() -> bool:
        nonlocal left
        left = (await js.stream_info(subjects.RUNS_STREAM)).state.messages
        return left == 0

    with contextlib.suppress(AssertionError):
        await eventually(empty, timeout, retrying=(Exception,), interval=0.5)
    return left


async def count(chaos: ChaosStack, run_ids: list[str], *, unsettled: int = 0) -> Counts:
    """What the durable state says about `run_ids` (each in its own session)."""
    counts = Counts(runs=len(run_ids), unsettled=unsettled)
    wanted = set(run_ids)
    events = await _stored(chaos.nc, subjects.EVENTS_STREAM, "runbus.events.>")
    finals: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    model_calls: Counter[str] = Counter()
    last_step: dict[str, str] = {}
    tools_done: set[str] = set()
    """`<run_id>:m<step>` of the steps whose tool results were published."""
    for _, data in events:
        event = _EVENT.decode(data)
        if event.run_id not in wanted:
            continue
        if event.type == "run.tool_result" and event.run_id in last_step:
            # Every reply streams its word before its calls: the results are that step's.
            tools_done.add(last_step[event.run_id])
        if event.type == "run.text_delta":
            counts.redone_after_tools += event.message_id in tools_done
            last_step[event.run_id] = event.message_id
        if event.type in TERMINAL:
            finals[event.run_id].append(event.type)
            if event.error is not None:
                counts.failures[f"{event.error.get('code')}: {event.error.get('message')}"] += 1
        elif event.type == "run.text_delta":
            model_calls[event.message_id] += 1
    counts.model_calls = sum(model_calls.values())
    counts.model_calls_repeated = sum(n - 1 for n in model_calls.values())
    for kinds in finals.values():
        counts.completed += kinds == ["run.completed"]
        counts.failed += kinds == ["run.failed"]
        counts.lost += not kinds
        counts.duplicated += len(kinds) > 1

    records = await chaos.nc.jetstream().key_value(subjects.RUN_STATE_BUCKET)
    for run_id, kinds in finals.items():
        try:
            entry = await records.get(Owner(TENANT, USER).key(run_id))
            record = msgspec.json.decode(entry.value or b"{}")
        except nats.js.errors.KeyNotFoundError:
            record = {}
        status = record.get("status")
        counts.retried += record.get("attempts", 1) > 1
        if kinds:
            counts.records_off += status != kinds[-1].removeprefix("run.")

    bookings = Counter(
        msgspec.json.decode(line)["run_id"]
        for line in _lines(ledger_path(chaos.data))
        if msgspec.json.decode(line)["run_id"] in wanted
    )
    counts.dup_side_effects = sum(n - 1 for n in bookings.values() if n > 1)

    sessions: dict[str, list[dict[str, Any]]] = {}
    for subject, data in await _stored(
        chaos.nc, subjects.HISTORY_STREAM, subjects.history_log(TENANT, "*")
    ):
        sessions.setdefault(subject.rsplit(".", 1)[1], []).extend(
            msgspec.json.decode(data)["messages"]
        )
    for run_id, kinds in finals.items():
        stored = sessions.get(Load.session_id(run_id), [])
        ids = Counter(m["message_id"] for m in stored)
        counts.dup_history += sum(n - 1 for n in ids.values())
        if kinds == ["run.completed"]:
            counts.lost_history += sum(1 for step in STEPS if f"{run_id}:{step}" not in ids)
            counts.bookings_missing += bookings[run_id] == 0
        unique = list({m["message_id"]: m for m in stored}.values())
        answered = {
            c["call_id"]
            for m in unique
            for c in m["contents"]
            if c.get("type") == "function_result"
        }
        errors = [
            c["error"]
            for m in unique
            for c in m["contents"]
            if c.get("type") == "function_result"
            and c.get("error")
            and not c["error"].startswith("outcome unknown")
        ]
        counts.tool_errors += len(errors)
        counts.tool_error_texts.update(errors)
        counts.orphan_calls += sum(
            1
            for m in unique
            for c in m["contents"]
            if c.get("type") == "function_call" and c["call_id"] not in answered
        )
    return counts


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines() if path.exists() else []


async def _stored(nc: NATS, stream: str, subject: str) -> list[tuple[str, bytes]]:
    """Every message of `stream` on `subject` (wildcards allowed), oldest first."""
    js = nc.jetstream()
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    subscription = await js.subscribe(
        subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    out: list[tuple[str, bytes]] = []
    try:
        while True:
            try:
                msg = await subscription.next_msg(timeout=2.0)
            except nats.errors.TimeoutError:
                return out  # nothing (more) on the subject
            out.append((msg.subject, msg.data))
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await subscription.unsubscribe()
