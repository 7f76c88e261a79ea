"""What the clients do while a fault is on: a stream of booking runs, a few at a time, each in
a session of its own, and runs that wait for a person's approval across the fault. Every run
request is sent until JetStream acknowledges it; what the client saw is kept for the checker."""

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from runbus import ops, subjects
from runbus.errors import RemoteError
from runbus.messages.runs import ApprovalDecide
from tests.cluster.harness import TENANT, USER, Cluster
from tests.helpers import eventually, take_time

TERMINAL = ("run.completed", "run.failed")


class Event(msgspec.Struct):
    """The fields of a run event the workload and the checker read."""

    type: str
    run_id: str = ""
    message_id: str = ""
    call_id: str = ""
    error: dict[str, Any] | None = None


EVENT = msgspec.json.Decoder(Event)


@dataclass
class Run:
    run_id: str
    agent: str
    session_id: str
    acknowledged: bool = False
    seen: list[str] = field(default_factory=list)
    """Final event types the client saw live, in order."""
    approval_call: str = ""
    """The call waiting for a person (runs of the `approve` agent)."""
    approved: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Workload:
    cluster: Cluster
    prefix: str
    runs: int
    in_flight: int
    approvals: int
    send_within: float = 120.0
    """Seconds a run request is sent again before the client gives up on it."""
    by_id: dict[str, Run] = field(default_factory=dict)
    started: int = 0
    done: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _live: Subscription | None = None
    _poller: "asyncio.Task[None] | None" = None

    def __post_init__(self) -> None:
        for index in range(self.approvals):
            self._add(f"{self.prefix}-a{index}", "approve")
        for index in range(self.runs):
            self._add(f"{self.prefix}-r{index:03d}", "book")

    def _add(self, run_id: str, agent: str) -> None:
        session = run_id.replace("-a", "-sa", 1) if agent == "approve" else f"{run_id}-s"
        self.by_id[run_id] = Run(run_id, agent, session)

    @property
    def waiting_for_approval(self) -> list[Run]:
        return [run for run in self.by_id.values() if run.agent == "approve"]

    @property
    def booking(self) -> list[Run]:
        return [run for run in self.by_id.values() if run.agent == "book"]

    async def listen(self) -> None:
        """Hear the client's own events live, and read the stream for those a fault kept
        from it (the checker reads the stream itself); until `close`."""
        assert self.cluster.client_nc is not None
        self._live = await self.cluster.client_nc.subscribe(
            subjects.events(TENANT, USER, "*"), cb=self._on_event
        )
        self._poller = asyncio.create_task(self._poll())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._live is not None:
            with contextlib.suppress(Exception):
                await self._live.unsubscribe()

    async def _on_event(self, msg: Msg) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            event = EVENT.decode(msg.data)
            run = self.by_id.get(event.run_id)
            if run is not None:
                await self._heard(run, event, live=True)

    async def _heard(self, run: Run, event: Event, *, live: bool) -> None:
        if event.type == "run.approval_requested" and not run.approval_call:
            run.approval_call = event.call_id
            await self._notify()
        elif event.type in TERMINAL:
            if live:
                run.seen.append(event.type)
            await self._finished(run)

    async def _finished(self, run: Run) -> None:
        if not run.finished.is_set():
            run.finished.set()
            self.done += 1
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def send(self, run: Run) -> None:
        """Send the run request until it is acknowledged (the same run id again is dropped
        by JetStream, or recognised as the caller's own)."""
        assert self.cluster.client is not None
        client = self.cluster.client

        async def acknowledged() -> bool:
            await client.start(run.agent, "Book me a flight.", session_id=run.session_id,
                               run_id=run.run_id)  # fmt: skip
            return True

        with contextlib.suppress(AssertionError):
            run.acknowledged = await eventually(
                acknowledged, self.send_within, retrying=(Exception,), interval=0.5
            )

    async def ask_approvals(self, timeout: float = 60.0) -> None:
        """Start the approval runs; return once each waits for a person (or ended without
        asking: the caller checks `approval_call`)."""
        await asyncio.gather(*(self.send(run) for run in self.waiting_for_approval))
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(
                    lambda: all(
                        run.approval_call or run.finished.is_set()
                        for run in self.waiting_for_approval
                    )
                ),
                timeout,
            )

    async def approve_all(self) -> None:
        """Approve every waiting call (after the fault): a lost reply is asked again, and a
        `conflict` then means the first one was taken."""
        assert self.cluster.client is not None
        client = self.cluster.client

        async def approve(run: Run) -> None:
            async def decided() -> bool:
                try:
                    await client.call(
                        ops.API_APPROVALS_DECIDE,
                        ApprovalDecide(
                            run_id=run.run_id, call_id=run.approval_call, decision="approved"
                        ),
                        timeout=5,
                    )
                except RemoteError as error:
                    if error.remote_code != "conflict":
                        raise
                return True

            run.approved = await eventually(decided, 60, retrying=(Exception,), interval=0.5)

        await asyncio.gather(*(approve(run) for run in self.waiting_for_approval))

    async def run(self, timeout: float) -> None:
        """Send the booking runs, `in_flight` at a time, each waiting for its final event
        (heard live, or read from the stream where a fault swallowed it)."""
        slots = asyncio.Semaphore(self.in_flight)
        deadline = time.monotonic() + timeout

        async def one(run: Run) -> None:
            async with slots:
                self.started += 1
                await self._notify()
                await self.send(run)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.finished.wait(), deadline - time.monotonic())

        await asyncio.gather(*(one(run) for run in self.booking))

    def in_flight_now(self) -> int:
        return self.started - sum(run.finished.is_set() for run in self.booking)

    async def finished_more(self, count: int, timeout: float) -> bool:
        """Wait until `count` more runs finished (False if `timeout` passed first): how a
        fault is held until the cluster has shown what it does under it."""
        target = self.done + count
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.done >= target), timeout)
            except TimeoutError:
                return False
        return True

    async def _poll(self) -> None:
        """Read the final event of the runs that look unfinished from the stream, for those
        whose live event a fault swallowed."""
        assert self.cluster.observer is not None
        js = self.cluster.observer.jetstream()
        while True:
            await take_time(1.0)  # the period of this fallback for missed final events
            for run in list(self.by_id.values()):
                if run.finished.is_set() or not run.acknowledged:
                    continue
                with contextlib.suppress(Exception):
                    last = await js.get_last_msg(
                        subjects.EVENTS_STREAM, subjects.events(TENANT, USER, run.run_id)
                    )
                    if last.data:
                        await self._heard(run, EVENT.decode(last.data), live=False)
