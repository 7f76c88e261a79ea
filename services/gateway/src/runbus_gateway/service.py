"""The gateway service: pulls run requests from the durable work queue, authenticates them,
runs them (`loop.execute_run`), publishes their events, keeps run records, and answers the
authenticated client API (`runbus.api.*`). Replicas share one consumer."""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Self

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from runbus import headers as h
from runbus import subjects
from runbus.errors import InternalError, NotFound, RunbusError, UnknownAgent
from runbus.jetstream import ensure_stream
from runbus.messages import ErrorInfo, RunFailed, RunRequest, is_identifier
from runbus.messages.runs import (
    APPROVAL_DECIDE_DECODER,
    RUN_CANCEL_DECODER,
    RUN_GET_DECODER,
    RUN_LIST_DECODER,
    RUN_REQUEST_DECODER,
    ApprovalDecide,
    ApprovalDecided,
    RunCancel,
    RunCompleted,
    RunGet,
    RunInfo,
    RunList,
    RunListed,
    RunRecord,
    RunStatus,
)
from runbus.service import Endpoint, Service, as_runbus_error
from runbus.settings import Settings, SettingsError
from runbus.telemetry import extract

from .agents import AgentSpec, load_agents
from .approvals import Approvals
from .auth import Principal, TokenVerifier
from .errors import (
    AgentMismatch,
    DeadLettered,
    DedupeKeyMismatch,
    RunCancelled,
    UndecodableRequest,
)
from .harness.guardrails import user_error
from .harness.runtime import Harness
from .loop import execute_run
from .owners import RunOwners
from .ports import BusPorts
from .runs import RETRYABLE, RunRecords, now, retry_delay
from .tenants import TenantLimits, TenantSlots

DUPLICATE_WINDOW: Final = 600.0
ACK_WAIT: Final = 30.0
MAX_ATTEMPTS: Final = 4
"""Deliveries that may run; one more delivery only moves the request to the dead letters."""
EVENTS_MAX_AGE: Final = 24 * 3600.0
DEAD_MAX_AGE: Final = 7 * 24 * 3600.0
PULL_WAIT: Final = 5.0
PULL_RETRY: Final = 0.5
STOP_GRACE: Final = 10.0
"""Seconds a stopping gateway lets its runs finish before it cuts them off."""
TENANT_POLL: Final = 0.2
"""Seconds between a queued run's tries for a slot of its tenant."""
PARKED_PER_SLOT: Final = 4
"""Runs a replica holds queued for their tenant, per run slot, before it stops pulling."""

FORWARDED_API: Final = (
    "memory.list",
    "memory.find",
    "memory.forget",
    "memory.stats",
    "sessions.get",
    "sessions.list",
    "sessions.state.update",
    "sessions.export",
    "sessions.import",
    "sessions.delete",
    "history.load",
)
"""Client operations the gateway authenticates and forwards to the owning service as they are."""

RAW_DECODER: Final = msgspec.json.Decoder(msgspec.Raw)


class GatewayService(Service):
    name = "gateway"
    description = "Owns the run: authentication, the tool loop, events, checkpoints"

    def __init__(
        self,
        nc: NATS,
        *,
        agents: dict[str, AgentSpec],
        verifier: TokenVerifier,
        run_concurrency: int = 64,
        run_timeout: float = 300.0,
        replicas: int = 1,
        ack_wait: float = ACK_WAIT,
        stop_grace: float = STOP_GRACE,
        tenant_limits: TenantLimits | None = None,
        duplicate_window: float = DUPLICATE_WINDOW,
        **kwargs: object,
    ) -> None:
        super().__init__(nc, **kwargs)  # type: ignore[arg-type]
        self.ack_wait = ack_wait
        self.duplicate_window = duplicate_window
        """Seconds JetStream drops a run request whose `Nats-Msg-Id` (= run id) it has seen."""
        self.stop_grace = stop_grace
        """Seconds without a heartbeat after which JetStream gives a run to another replica."""
        self.agents = agents
        self.harnesses = {name: Harness.from_config(a.harness) for name, a in agents.items()}
        for name, harness in self.harnesses.items():
            harness.check_tool_names(agents[name].tools)
        self.verifier = verifier
        self.run_concurrency = run_concurrency
        self.run_timeout = run_timeout
        self.replicas = replicas
        self.ports = BusPorts(self.bus)
        self._pull_task: asyncio.Task[None] | None = None
        self._run_slots = asyncio.Semaphore(run_concurrency)
        self._stopping = asyncio.Event()
        self._running: dict[str, asyncio.Task[RunCompleted]] = {}
        self._cancelled: set[str] = set()
        self._records: RunRecords | None = None
        self._owners: RunOwners | None = None
        self._cancel_sub: Subscription | None = None
        self.tenant_limits = tenant_limits or TenantLimits()
        self._tenants: TenantSlots | None = None
        self._leases: dict[str, tuple[str, str]] = {}
        """Runs of this replica holding a tenant slot → their tenant and lease (renewed by
        heartbeat)."""
        self._parked = asyncio.Semaphore(run_concurrency * PARKED_PER_SLOT)
        self._live: dict[str, RunRecord] = {}
        """Records of the runs executing here, for status changes mid-run."""
        self._waiting: dict[str, int] = {}
        """Runs waiting for approval → how many of their calls are waiting."""
        self._queued: dict[str, tuple[str, str]] = {}
        """Runs of this replica waiting for a slot of their tenant → their owner."""
        self._cancel_queued: set[str] = set()
        """Of those, the ones a cancel reached: they end instead of starting."""
        self.ports.on_waiting = self._on_waiting

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        try:
            limits = TenantLimits.parse(settings.tenant_run_limit, settings.tenant_run_limits)
        except ValueError as exc:
            raise SettingsError("RUNBUS_TENANT_RUN_LIMITS", str(exc)) from None
        return cls(
            nc,
            agents=load_agents(Path(settings.agents_dir) if settings.agents_dir else None),
            verifier=TokenVerifier.from_file(
                Path(settings.tokens_file) if settings.tokens_file else None
            ),
            run_concurrency=settings.run_concurrency,
            run_timeout=settings.run_timeout,
            replicas=settings.stream_replicas,
            tenant_limits=limits,
            tracer_provider=tracer_provider,
            request_timeout=settings.request_timeout,
        )

    @property
    def records(self) -> RunRecords:
        assert self._records is not None, "start() opens the run records"
        return self._records

    def endpoints(self) -> list[Endpoint]:
        forwarded = [
            Endpoint(
                f"api-{op.replace('.', '-')}",
                subjects.api(op),
                RAW_DECODER,
                self._forwarder(op),
                span_subject=subjects.API_TEMPLATE,
            )
            for op in FORWARDED_API
        ]
        return [
            Endpoint(
                "api-runs-get",
                subjects.api("runs.get"),
                RUN_GET_DECODER,
                self.on_run_get,
                span_subject=subjects.API_TEMPLATE,
            ),
            Endpoint(
                "api-runs-list",
                subjects.api("runs.list"),
                RUN_LIST_DECODER,
                self.on_run_list,
                span_subject=subjects.API_TEMPLATE,
            ),
            Endpoint(
                "api-runs-cancel",
                subjects.api("runs.cancel"),
                RUN_CANCEL_DECODER,
                self.on_run_cancel,
                span_subject=subjects.API_TEMPLATE,
            ),
            Endpoint(
                "api-approvals-decide",
                subjects.api("approvals.decide"),
                APPROVAL_DECIDE_DECODER,
                self.on_approval_decide,
                span_subject=subjects.API_TEMPLATE,
            ),
            *forwarded,
        ]

    async def on_start(self) -> None:
        js = self.nc.jetstream()
        for config in (
            StreamConfig(
                name=subjects.RUNS_STREAM,
                subjects=[subjects.RUNS_ALL],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=self.duplicate_window,
                num_replicas=self.replicas,
            ),
            StreamConfig(
                name=subjects.EVENTS_STREAM,
                subjects=[subjects.EVENTS_ALL],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=EVENTS_MAX_AGE,
                duplicate_window=DUPLICATE_WINDOW,
                num_replicas=self.replicas,
            ),
            StreamConfig(
                name=subjects.DEAD_STREAM,
                subjects=[subjects.DEAD_ALL],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=DEAD_MAX_AGE,
                num_replicas=self.replicas,
            ),
        ):
            await ensure_stream(self.nc, config)
        self._records = await RunRecords.open(self.nc, replicas=self.replicas)
        self._owners = await RunOwners.open(self.nc, replicas=self.replicas)
        self.ports.approvals = await Approvals.open(self.nc, replicas=self.replicas)
        if self.tenant_limits.any:
            self._tenants = await TenantSlots.open(
                self.nc, self.tenant_limits, lease=2 * self.ack_wait, replicas=self.replicas
            )
        self._subscription = await js.pull_subscribe(
            subjects.RUNS_ALL,
            durable=subjects.RUNS_CONSUMER,
            stream=subjects.RUNS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait,
                max_deliver=MAX_ATTEMPTS + 1,
                max_ack_pending=-1,
            ),
        )
        self._cancel_sub = await self.nc.subscribe(subjects.CANCEL_ALL, cb=self._on_cancel)
        self._pull_task = asyncio.create_task(self._pull_runs())

    async def on_draining(self) -> None:
        self._stopping.set()
        if self._cancel_sub is not None:
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await self._cancel_sub.unsubscribe()
        if self._pull_task is not None:
            self._pull_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pull_task
            # nats-py 2.16's pull subscription can keep one unfinished queue item (a late 408
            # taken with get_nowait and never task_done); a connection drain would then wait
            # out its whole timeout on it. The durable consumer is server-side: unsubscribing
            # loses nothing.
            with contextlib.suppress(Exception):
                await self._subscription.unsubscribe()
        # Runs in flight may finish; what did not start stays queued for another replica, and
        # what is cut off here is redelivered (and resumed) elsewhere, since it was never acked.
        grace = self.stop_grace if self.nc.is_connected else 0.0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                for _ in range(self.run_concurrency):
                    await self._run_slots.acquire()
        for task in list(self._running.values()):
            task.cancel()

    # -- the run queue -------------------------------------------------------------------

    async def _pull_runs(self) -> None:
        """Pull one run per free slot, so a busy replica leaves the queue to the others.

        One-message fetches return as soon as a run is there; a larger batch would make
        nats-py linger for the rest of the batch before handing over the first.
        """
        while not self._stopping.is_set():
            await self._run_slots.acquire()
            try:
                messages = await self._subscription.fetch(1, timeout=PULL_WAIT)
            except nats.errors.TimeoutError:
                messages = []
            except (nats.errors.ConnectionClosedError, nats.errors.DrainTimeoutError):
                messages = []
                self._stopping.set()
            except (nats.js.errors.APIError, nats.errors.NoRespondersError) as exc:
                # A consumer leader election on a cluster answers 503 for a moment; the pull
                # loop must outlive it, or this replica would never pull another run.
                self.log.warning("run_pull_failed", error=repr(exc))
                self._run_slots.release()
                await asyncio.sleep(PULL_RETRY)
                continue
            except BaseException:
                self._run_slots.release()
                raise
            if messages:
                self.spawn(self._run_one(messages[0]))
            else:
                self._run_slots.release()

    async def _run_one(self, msg: Msg) -> None:
        try:
            await self.on_run(msg)
        finally:
            self._run_slots.release()

    async def on_run(self, msg: Msg) -> None:
        """One delivery of a run request: admit, execute (or resume), publish, ack.

        A retryable failure is redelivered with backoff; after MAX_ATTEMPTS the request moves
        to the dead letters with its error and the run fails. Every other failure is final.
        """
        headers = msg.headers or {}
        run_id = headers.get(h.MSG_ID, "")
        attempt = msg.metadata.num_delivered if msg.metadata else 1
        with self.tracer.start_as_current_span(
            "process " + subjects.RUNS_TEMPLATE,
            context=extract(headers),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "messaging.operation.type": "process",
                "messaging.consumer.group.name": subjects.RUNS_CONSUMER,
                "runbus.attempt": attempt,
            },
        ) as span:
            heartbeat = asyncio.create_task(self._heartbeat(msg, run_id))
            record: RunRecord | None = None
            principal: Principal | None = None
            try:
                # Verified first, so even a broken request's failure reaches its own sender.
                principal = self.verifier.verify(headers.get(h.AUTH))
                request = self._admit(msg)
                run_id = request.run_id
                span.set_attribute("runbus.run_id", run_id)
                assert self._owners is not None, "start() opens the run owners"
                await self._owners.claim(run_id, principal.tenant, principal.user_id)
                agent = self.agents.get(request.agent)
                if agent is None:
                    raise UnknownAgent(f"no agent named {request.agent!r}")
                record = self._record(request, principal, attempt)
                if attempt > 1 and await self._cancelled_while_queued(record):
                    raise RunCancelled(run_id)
                if attempt > MAX_ATTEMPTS:
                    raise DeadLettered(attempt - 1, "the gateway stopped during every attempt")
                await self._take_tenant_slot(record)
                completed = await self._execute(request, agent, principal, record)
                ctx = self._ctx(request, principal)
                await self.ports.emit(ctx, completed, event_id="completed")
                await asyncio.gather(
                    self.ports.settle(ctx),
                    self.records.set_status(record, "completed", text=completed.text),
                )
            except Exception as exc:
                error = as_runbus_error(exc)
                info = error.to_info()
                span.set_status(Status(StatusCode.ERROR, error.message))
                span.set_attribute("error.type", info.code)
                if info.code in RETRYABLE and attempt < MAX_ATTEMPTS:
                    self.log.warning(
                        "run_retrying",
                        run_id=run_id,
                        attempt=attempt,
                        code=info.code,
                        reason=error.message,
                    )
                    heartbeat.cancel()
                    if record is not None:
                        shown = self._shown(msg, error)
                        with contextlib.suppress(Exception):
                            await self.records.set_status(record, "queued", error=shown)
                    await msg.nak(delay=retry_delay(attempt))
                    return
                await self._fail(msg, run_id, principal, record, error, attempt)
            finally:
                heartbeat.cancel()
                if record is not None:
                    await self._release_tenant_slot(record)
            await msg.ack()

    async def _take_tenant_slot(self, record: RunRecord) -> None:
        """Wait, as `queued`, until the run's tenant is under its concurrent-run limit.

        A waiting run gives its run slot back, so one tenant's backlog does not stop this
        replica from running other tenants' runs; its heartbeat keeps it from redelivery.
        """
        if self._tenants is None:
            return
        lease = _lease_key(record)
        if await self._tenants.try_acquire(record.tenant, lease):
            self._leases[record.run_id] = (record.tenant, lease)
            return
        self.log.info("run_queued", run_id=record.run_id, tenant=record.tenant)
        await self.records.set_status(record, "queued")
        parked = not self._parked.locked()
        if parked:
            await self._parked.acquire()
            self._run_slots.release()
        self._queued[record.run_id] = (record.tenant, record.user_id)
        try:
            # Polled rather than watched: a slot frees when any replica's run ends, and a
            # watch per queued run would cost more than a read every TENANT_POLL seconds.
            while True:
                if record.run_id in self._cancel_queued:
                    raise RunCancelled(record.run_id)
                if await self._tenants.try_acquire(record.tenant, lease):
                    break
                await asyncio.sleep(TENANT_POLL)
            self._leases[record.run_id] = (record.tenant, lease)
        finally:
            self._queued.pop(record.run_id, None)
            self._cancel_queued.discard(record.run_id)
            if parked:
                await self._run_slots.acquire()
                self._parked.release()

    async def _cancelled_while_queued(self, record: RunRecord) -> bool:
        """A redelivered run whose owner cancelled it while it waited for its retry."""
        earlier = await self.records.get(record.tenant, record.user_id, record.run_id)
        return earlier is not None and earlier.status == "cancelled"

    async def _release_tenant_slot(self, record: RunRecord) -> None:
        if self._tenants is not None and self._leases.pop(record.run_id, None) is not None:
            with contextlib.suppress(Exception):
                await self._tenants.release(record.tenant, _lease_key(record))

    async def _execute(
        self, request: RunRequest, agent: AgentSpec, principal: Principal, record: RunRecord
    ) -> RunCompleted:
        ctx = self._ctx(request, principal)
        # The `running` record is written alongside the run rather than before it; it is only
        # a status for people, and it always lands before the final record (awaited below).
        noted = asyncio.ensure_future(self.records.put(record))
        with self.tracer.start_as_current_span(
            f"invoke_agent {agent.name}",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent.name,
                "gen_ai.conversation.id": request.session_id,
                "runbus.run_id": request.run_id,
                "runbus.tenant": principal.tenant,
            },
        ):
            self.log.info(
                "run_started",
                run_id=request.run_id,
                agent=agent.name,
                user_id=principal.user_id,
                tenant=principal.tenant,
                attempt=record.attempts,
            )
            task = asyncio.ensure_future(
                execute_run(request, agent, ctx, self.ports, self.harnesses[agent.name])
            )
            self._running[request.run_id] = task
            self._live[request.run_id] = record
            try:
                completed = await task
            except asyncio.CancelledError:
                if request.run_id not in self._cancelled or not task.cancelled():
                    raise
                raise RunCancelled(request.run_id) from None
            finally:
                self._running.pop(request.run_id, None)
                self._live.pop(request.run_id, None)
                self._waiting.pop(request.run_id, None)
                self._cancelled.discard(request.run_id)
                with contextlib.suppress(Exception):
                    await noted
            self.log.info(
                "run_completed", run_id=request.run_id, output_tokens=completed.usage.output_tokens
            )
            return completed

    def _ctx(self, request: RunRequest, principal: Principal) -> h.RunContext:
        agent = self.agents.get(request.agent)
        memory = agent.memory.search_props() if agent and agent.memory.offers_tool else {}
        return h.RunContext(
            run_id=request.run_id,
            session_id=request.session_id,
            agent=request.agent,
            props={
                "user_id": principal.user_id,
                "tenant": principal.tenant,
                "request_id": request.run_id,
                **memory,
            },
            deadline=time.time() + self.run_timeout,
        )

    @staticmethod
    def _record(request: RunRequest, principal: Principal, attempt: int) -> RunRecord:
        stamp = now()
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
        )

    def _admit(self, msg: Msg) -> RunRequest:
        try:
            request = RUN_REQUEST_DECODER.decode(msg.data)
        except UnicodeDecodeError as exc:
            raise UndecodableRequest(str(exc)) from None
        subject_agent = msg.subject.rsplit(".", 1)[-1]
        if subject_agent != request.agent:
            raise AgentMismatch(subject_agent, request.agent)
        msg_id = (msg.headers or {}).get(h.MSG_ID, "")
        if msg_id != request.run_id:
            raise DedupeKeyMismatch(msg_id, request.run_id)
        return request

    async def _fail(
        self,
        msg: Msg,
        run_id: str,
        principal: Principal | None,
        record: RunRecord | None,
        error: RunbusError,
        attempt: int,
    ) -> None:
        info = error.to_info()
        if isinstance(error, InternalError):
            self.log.exception("run_failed", run_id=run_id, attempt=attempt)
        else:
            self.log.info("run_failed", run_id=run_id, code=info.code, reason=error.message)
        if info.code in RETRYABLE or isinstance(error, DeadLettered):
            await self._dead_letter(msg, info.code, error.message)
        # The log and the dead letter keep the real message; the user reads the agent's.
        info = self._shown(msg, error)
        if record is not None:
            status: RunStatus = "cancelled" if isinstance(error, RunCancelled) else "failed"
            with contextlib.suppress(Exception):
                await self.records.set_status(record, status, error=info)
        if not is_identifier(run_id):
            # Not a subject-safe id: there is no events subject a client could be reading.
            self.log.info("run_failure_not_published", reason="no usable run id")
            return
        owner = {"tenant": principal.tenant, "user_id": principal.user_id} if principal else {}
        ctx = h.RunContext(run_id=run_id, props=owner)
        await self.ports.emit(ctx, RunFailed(run_id=run_id, error=info), event_id="failed")
        with contextlib.suppress(Exception):
            await self.ports.settle(ctx)

    def _shown(self, msg: Msg, error: RunbusError) -> ErrorInfo:
        """The error as the run's owner reads it (event, run record): the agent's
        `[harness] errors` table, and never an internal message (`user_error`)."""
        harness = self.harnesses.get(msg.subject.rsplit(".", 1)[-1])
        return harness.user_error(error) if harness is not None else user_error(error)

    async def _dead_letter(self, msg: Msg, code: str, message: str) -> None:
        agent = msg.subject.rsplit(".", 1)[-1]
        headers = dict(msg.headers or {})
        headers.pop(h.MSG_ID, None)
        headers.pop(h.AUTH, None)  # a credential does not belong in a long-kept stream
        headers.update({h.ERROR: code, "rb-error-message": message[:1024]})
        target = subjects.dead(agent if is_identifier(agent) else "unknown")
        await self.nc.jetstream().publish(target, msg.data, headers=headers)

    async def _heartbeat(self, msg: Msg, run_id: str) -> None:
        """Tell JetStream the run is alive so a long run is not redelivered meanwhile, and
        keep its tenant slot."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            with contextlib.suppress(Exception):
                await msg.in_progress()
            held = self._leases.get(run_id)
            if held is not None and self._tenants is not None:
                with contextlib.suppress(Exception):
                    await self._tenants.renew(*held)

    async def _on_waiting(self, ctx: h.RunContext, waiting: bool) -> None:
        """`waiting_approval` while any call of the run waits for a person, else `running`."""
        count = self._waiting.get(ctx.run_id, 0) + (1 if waiting else -1)
        self._waiting[ctx.run_id] = count
        if count <= 0:
            self._waiting.pop(ctx.run_id, None)
        record = self._live.get(ctx.run_id)
        if record is None or (count > 1 if waiting else count > 0):
            return  # the status only changes on the first wait and the last decision
        status: RunStatus = "waiting_approval" if waiting else "running"
        with contextlib.suppress(Exception):
            await self.records.set_status(record, status)

    async def _on_cancel(self, msg: Msg) -> None:
        """Cancel the run this replica holds for that owner; another owner's run of the same
        id (there can be none: ids are claimed) is never touched."""
        parsed = subjects.parse_run_cancel(msg.subject)
        if parsed is None:
            return
        tenant, user_id, run_id = parsed
        if self._queued.get(run_id) == (tenant, user_id):
            self._cancel_queued.add(run_id)
            self.log.info("run_cancelling", run_id=run_id, status="queued")
        live = self._live.get(run_id)
        if live is None or (live.tenant, live.user_id) != (tenant, user_id):
            return
        task = self._running.get(run_id)
        if task is not None and not task.done():
            self._cancelled.add(run_id)
            task.cancel()
            self.log.info("run_cancelling", run_id=run_id)

    # -- the client API ------------------------------------------------------------------

    def _principal(self, ctx: h.RunContext) -> Principal:
        return self.verifier.verify(ctx.auth)

    def _api_ctx(self, principal: Principal) -> h.RunContext:
        # Built from the verified principal only: rb-prop-* headers a client sent are ignored.
        return h.RunContext(
            props={"user_id": principal.user_id, "tenant": principal.tenant},
            deadline=time.time() + self.bus.request_timeout,
        )

    def _forwarder(self, op: str) -> Callable[[h.RunContext, msgspec.Raw], Awaitable[msgspec.Raw]]:
        async def forward(ctx: h.RunContext, body: msgspec.Raw) -> msgspec.Raw:
            trusted = self._api_ctx(self._principal(ctx))
            return await self.bus.request(subjects.internal(op), body, RAW_DECODER, ctx=trusted)

        return forward

    async def on_run_get(self, ctx: h.RunContext, request: RunGet) -> RunInfo:
        principal = self._principal(ctx)
        record = await self.records.get(principal.tenant, principal.user_id, request.run_id)
        if record is None:
            raise NotFound(f"no run {request.run_id!r}")
        return RunInfo(record=record)

    async def on_run_list(self, ctx: h.RunContext, request: RunList) -> RunListed:
        principal = self._principal(ctx)
        records = await self.records.list(principal.tenant, principal.user_id)
        if request.session_id is not None:
            records = [r for r in records if r.session_id == request.session_id]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return RunListed(records=records[: request.limit])

    async def on_run_cancel(self, ctx: h.RunContext, request: RunCancel) -> RunInfo:
        principal = self._principal(ctx)
        record = await self.records.get(principal.tenant, principal.user_id, request.run_id)
        if record is None:
            raise NotFound(f"no run {request.run_id!r}")
        if record.status == "queued" and record.error is not None:
            # Waiting in the stream for a retry: no replica holds it to tell. The record says
            # cancelled, and the next delivery ends there (see `_cancelled_while_queued`).
            record = await self.records.set_status(record, "cancelled")
        elif record.status in ("running", "waiting_approval", "queued"):
            cancel = subjects.run_cancel(principal.tenant, principal.user_id, request.run_id)
            await self.nc.publish(cancel, b"")
        return RunInfo(record=record)

    async def on_approval_decide(
        self, ctx: h.RunContext, request: ApprovalDecide
    ) -> ApprovalDecided:
        """A person approves or denies a call their run is waiting on; the first decision wins."""
        principal = self._principal(ctx)
        assert self.ports.approvals is not None
        decision = await self.ports.approvals.decide(
            request.run_id,
            request.call_id,
            principal.tenant,
            principal.user_id,
            request.decision,
            request.note,
        )
        self.log.info(
            "approval_decided",
            run_id=request.run_id,
            call_id=request.call_id,
            decision=decision,
            approver=principal.user_id,
        )
        return ApprovalDecided(run_id=request.run_id, call_id=request.call_id, decision=decision)


def _lease_key(record: RunRecord) -> str:
    """A run's entry in its tenant's leases: the user too, so no other user's run shares it."""
    return f"{record.user_id}.{record.run_id}"
