"""The run queue: the streams a run travels through, and admission — one delivery of a run
request becomes a `LocalRun` (authenticated, decoded, its id claimed for its owner) that runs,
then is booked as completed, retried or failed."""

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Final

import msgspec
import structlog
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from opentelemetry import trace
from opentelemetry.trace import Tracer

from runbus import headers as h
from runbus import session_ids, subjects
from runbus.cancels import RunCancels
from runbus.consumer import ConsumerSpec, Delivery
from runbus.decoding import decode_untrusted
from runbus.errors import NotFound, UnknownAgent
from runbus.messages import RunRequest
from runbus.messages.runs import RUN_REQUEST_DECODER, RunRecord
from runbus.tokens import Principal, TokenVerifier, is_run_msg_id, msg_run_id

from .agents import AgentSpec
from .bookkeeping import EndedEarlier, RunBook
from .errors import (
    AgentMismatch,
    DeadLettered,
    DedupeKeyMismatch,
    RunCancelled,
)
from .local_run import LocalRun, Slots
from .ports import BusPorts
from .run.handoffs import session_agent
from .runs import RunRecords, now
from .tenants import TenantSlots

DUPLICATE_WINDOW: Final = 600.0
ENDED: Final = frozenset({"completed", "failed"})
EVENTS_MAX_AGE: Final = 24 * 3600.0
DEAD_MAX_AGE: Final = 7 * 24 * 3600.0

log = structlog.get_logger()


def run_streams(replicas: int, duplicate_window: float) -> list[StreamConfig]:
    """The run queue (deduped by run id), the run events, and the dead letters."""
    return [
        StreamConfig(
            name=subjects.RUNS_STREAM,
            subjects=[subjects.RUNS_ALL],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=duplicate_window,
            num_replicas=replicas,
        ),
        StreamConfig(
            name=subjects.EVENTS_STREAM,
            subjects=[subjects.EVENTS_ALL],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=EVENTS_MAX_AGE,
            duplicate_window=DUPLICATE_WINDOW,
            num_replicas=replicas,
            # A run in flight is read off its events by direct gets (runs.py).
            allow_direct=True,
        ),
        StreamConfig(
            name=subjects.DEAD_STREAM,
            subjects=[subjects.DEAD_ALL],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=DEAD_MAX_AGE,
            num_replicas=replicas,
        ),
    ]


def run_consumer(ack_wait: float) -> ConsumerSpec:
    """The one durable consumer every gateway replica pulls runs from."""
    return ConsumerSpec(
        stream=subjects.RUNS_STREAM,
        durable=subjects.RUNS_CONSUMER,
        subject=subjects.RUNS_ALL,
        config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            # Never dropped by the server: deliveries pulled onto a connection stuck behind a
            # fault count but are never seen. The gateway fails a run for good by its own
            # count (`_may_run`), and acks only once its final event is stored.
            max_deliver=-1,
            max_ack_pending=-1,
        ),
        span_name="process " + subjects.RUNS_TEMPLATE,
    )


@dataclass(frozen=True, kw_only=True)
class RunQueue:
    """Admission of the run queue's deliveries, with everything it needs, built once at start."""

    agents: dict[str, AgentSpec]
    verifier: TokenVerifier
    records: RunRecords
    tenants: TenantSlots | None
    ports: BusPorts
    book: RunBook
    runs: RunCancels[LocalRun]
    slots: Slots
    run_timeout: float
    heartbeat: float
    tracer: Tracer

    async def on_run(self, delivery: Delivery) -> None:
        """One delivery of a run request: admit, execute (or resume), book the outcome.

        A retryable failure is redelivered with backoff; after `book.max_attempts` it moves
        to the dead letters with its error and the run fails. Every other failure is final.
        """
        run_id = msg_run_id(delivery.headers.get(h.MSG_ID, ""))
        agent = addressed_agent(delivery)
        principal: Principal | None = None
        run: LocalRun | None = None
        try:
            # Verified first, so even a broken request's failure reaches its own sender.
            principal = self.verifier.verify(delivery.headers.get(h.AUTH))
            request = admit(delivery, agent)
            run_id = request.run_id
            earlier = await self._earlier(delivery, principal, run_id)
            run = await self._admitted(delivery, request, principal, earlier)
            if delivery.attempt > 1:
                # An earlier delivery the server gave up on may still be going: it stops at
                # its next boundary (run/pause.py).
                await self.book.pauses.fence(run.owner, run.run_id, delivery.attempt)
            await self._may_run(delivery, run, earlier)
            with self.runs.holding(run.owner, run.run_id, run):
                await run.take_tenant_slot()
                await self._execute(run)
        except Exception as exc:
            record = run.record if run else None
            await self.book.failed(delivery, agent, run_id, principal, record, exc)
        finally:
            if run is not None:
                await run.release()

    async def _earlier(
        self, delivery: Delivery, principal: Principal, run_id: str
    ) -> RunRecord | None:
        """What an earlier delivery or a cancel left of the run, read once per delivery. A
        first delivery reads the stored record only (one read): a run never delivered has no
        events to project."""
        read = self.records.get if delivery.attempt > 1 else self.records.stored
        return await read(principal.tenant, principal.user_id, run_id)

    async def _admitted(
        self,
        delivery: Delivery,
        request: RunRequest,
        principal: Principal,
        earlier: RunRecord | None,
    ) -> LocalRun:
        """The run of an admitted request, its agent known. A run id is its owner's own: the
        same id of another owner is another run (records, events and cancels are keyed by
        owner), so nobody can deny anyone a run id."""
        trace.get_current_span().set_attribute("runbus.run_id", request.run_id)
        if session_ids.foreign(request.session_id, principal.tenant, principal.user_id):
            # Scoped to another user (runbus.session_ids): answered as the history service
            # answers another owner's session, so no explicit id reaches one either.
            raise NotFound(f"no session {request.session_id!r}")
        agent = self.agents.get(request.agent)
        if agent is None:
            raise UnknownAgent(f"no agent named {request.agent!r}")
        # A session handed to another agent goes on with it (run/handoffs.py); a delivery
        # after the first stays with the agent the first one ran.
        held = await self._session_agent(delivery, request, agent, principal, earlier)
        if held is not agent:
            agent, request = held, msgspec.structs.replace(request, agent=held.name)
        return LocalRun(
            request,
            agent,
            self._ctx(request, agent, principal, delivery.headers.get(h.AUTH, "")),
            _record(request, principal, delivery.attempt),
            records=self.records,
            tenants=self.tenants,
            slots=self.slots,
            renew_every=self.heartbeat,
        )

    async def _session_agent(
        self,
        delivery: Delivery,
        request: RunRequest,
        agent: AgentSpec,
        principal: Principal,
        earlier: RunRecord | None,
    ) -> AgentSpec:
        if delivery.attempt > 1 and earlier is not None and earlier.agent in self.agents:
            return self.agents[earlier.agent]
        ctx = h.RunContext(
            run_id=request.run_id,
            session_id=request.session_id,
            agent=request.agent,
            props={"user_id": principal.user_id, "tenant": principal.tenant},
        )
        return await session_agent(self.ports, ctx, agent, self.agents)

    async def _may_run(self, delivery: Delivery, run: LocalRun, earlier: RunRecord | None) -> None:
        """Not when its owner cancelled it while it waited in the stream, for its first
        delivery (api.py) or its retry, nor when every attempt was cut off, nor (a child run)
        when its parent ended meanwhile: a cancel of the parent that came before the child was
        taken reached no replica."""
        owner = run.owner
        if earlier is not None and earlier.status == "cancelled":
            raise RunCancelled(run.run_id)
        if delivery.attempt > 1 and earlier is not None and earlier.status in ENDED:
            # Its final event is stored, or (failed) is stored again by its ending; the run
            # itself is never run again.
            raise EndedEarlier(earlier)
        if parent_id := run.request.parent_run_id:
            parent = await self.records.get(owner.tenant, owner.user_id, parent_id)
            if parent is not None and parent.status in ("cancelled", "failed"):
                raise RunCancelled(run.run_id)
        if delivery.attempt > self.book.max_attempts:
            raise DeadLettered(delivery.attempt - 1, "the gateway stopped during every attempt")
        if self.runs.cancelled(owner, run.run_id):
            # Its cancel came after the reads above, before the run is held (nothing awaits
            # from here to `holding`): caught when `runs` remembers cancels.
            raise RunCancelled(run.run_id)

    async def _execute(self, run: LocalRun) -> None:
        # A first delivery that never queued writes no `running` record (each stored write is
        # an fsync): until its final record, runs.get and runs.list read it off its own events
        # (runs.py). A later delivery, or one that queued for its tenant, may have a record
        # that says otherwise: that one is brought up to date alongside the run (only a status
        # for people), and it always lands before the final record (awaited below).
        noted: asyncio.Future[None] | None = None
        if run.record.attempts > 1 or run.record.status != "running":
            noted = asyncio.ensure_future(run.set_status("running"))
        agent, ctx = run.agent, run.ctx
        with self.tracer.start_as_current_span(
            f"invoke_agent {agent.name}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent.name,
                "gen_ai.conversation.id": ctx.session_id,
                "runbus.run_id": run.run_id,
                "runbus.tenant": run.record.tenant,
            },
        ):
            log.info(
                "run_started",
                run_id=run.run_id,
                agent=agent.name,
                user_id=run.record.user_id,
                tenant=run.record.tenant,
                attempt=run.record.attempts,
            )
            try:
                completed = await run.execute(self.ports)
            finally:
                if noted is not None:
                    with contextlib.suppress(Exception):
                        await noted
            log.info(
                "run_completed", run_id=run.run_id, output_tokens=completed.usage.output_tokens
            )
        await self.book.completed(ctx, run.record, completed)

    def _ctx(
        self, request: RunRequest, agent: AgentSpec, principal: Principal, auth: str
    ) -> h.RunContext:
        memory = agent.memory.search_props() if agent.memory.offers_tool else {}
        # A child run (an agent called as a tool) carries its tree, for its own calls' limits.
        lineage = (
            {
                "parent_run_id": request.parent_run_id,
                "root_run_id": request.root_run_id,
                "depth": str(request.depth),
            }
            if request.parent_run_id
            else {}
        )
        return h.RunContext(
            run_id=request.run_id,
            session_id=request.session_id,
            agent=request.agent,
            props={
                "user_id": principal.user_id,
                "tenant": principal.tenant,
                "request_id": request.run_id,
                **memory,
                **lineage,
            },
            deadline=time.time() + self.run_timeout,
            # Its own credential, never forwarded: the run starts its child runs with it.
            auth=auth,
        )


def addressed_agent(delivery: Delivery) -> str:
    """The agent a run request was published for (`runbus.runs.<agent>`)."""
    return delivery.msg.subject.rsplit(".", 1)[-1]


def admit(delivery: Delivery, agent: str) -> RunRequest:
    """The request, if its body decodes, names the subject's `agent` and is deduped by its run
    id (`Nats-Msg-Id` = `tokens.run_msg_id`, or the bare `run_id`); `bad_request` otherwise,
    in one attempt."""
    msg = delivery.msg
    request = decode_untrusted(RUN_REQUEST_DECODER, msg.data, "run request")
    if agent != request.agent:
        raise AgentMismatch(agent, request.agent)
    msg_id = delivery.headers.get(h.MSG_ID, "")
    if not is_run_msg_id(msg_id, delivery.headers.get(h.AUTH), request.run_id):
        raise DedupeKeyMismatch(msg_id, request.run_id)
    return request


def _record(request: RunRequest, principal: Principal, attempt: int) -> RunRecord:
    stamp = now()
    # The span of this delivery continues the request's trace (a redelivery too), so its
    # trace id is the run's; it is valid even where no span is exported.
    span = trace.get_current_span().get_span_context()
    return RunRecord(
        run_id=request.run_id,
        agent=request.agent,
        session_id=request.session_id,
        tenant=principal.tenant,
        user_id=principal.user_id,
        status="running",
        created_at=stamp,
        updated_at=stamp,
        attempts=attempt,
        trace_id=trace.format_trace_id(span.trace_id) if span.is_valid else "",
        parent_run_id=request.parent_run_id,
        root_run_id=request.root_run_id,
        depth=request.depth,
    )
