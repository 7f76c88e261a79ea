"""The gateway service, wired: the run queue (`queue.py`) pulled through the shared durable
consumer, the runs this replica holds (`local_run.py`), their bookkeeping
(`bookkeeping.py`) and the client API (`api.py`). Replicas share one consumer."""

import asyncio
import contextlib
from pathlib import Path
from typing import Final, Self

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry.sdk.trace import TracerProvider

from runbus import subjects
from runbus.cancels import RunCancels
from runbus.consumer import DurableConsumer
from runbus.jetstream import ensure_stream
from runbus.service import DEFAULT_OPTIONS, Endpoint, Service, ServiceOptions
from runbus.settings import Settings, SettingsError
from runbus.tokens import TokenVerifier

from .agents import AgentSpec, load_agents
from .api import ClientApi
from .approvals import Approvals
from .bookkeeping import RETRY_WINDOW, RunBook
from .local_run import LocalRun, Slots
from .ports import BusPorts
from .queue import DUPLICATE_WINDOW, RunQueue, run_consumer, run_streams
from .runs import RunRecords
from .tenants import TenantLimits, TenantSlots

ACK_WAIT: Final = 30.0
STOP_GRACE: Final = 10.0
"""Seconds a stopping gateway lets its runs finish before it cuts them off."""
PARKED_PER_SLOT: Final = 4
"""Runs a replica holds queued for their tenant, per run slot, before it stops pulling."""
CANCELS_REMEMBERED: Final = 1024
"""Recent cancels a replica keeps, for runs it has not taken yet."""


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
        retry_window: float = RETRY_WINDOW,
        stop_grace: float = STOP_GRACE,
        tenant_limits: TenantLimits | None = None,
        duplicate_window: float = DUPLICATE_WINDOW,
        options: ServiceOptions = DEFAULT_OPTIONS,
    ) -> None:
        super().__init__(nc, options=options)
        self.ack_wait = ack_wait
        """Seconds without a heartbeat after which JetStream gives a run to another replica."""
        self.retry_window = retry_window
        """Seconds of backoff a run failing `unavailable` is retried over."""
        self.stop_grace = stop_grace
        self.duplicate_window = duplicate_window
        """Seconds JetStream drops a run request whose `Nats-Msg-Id` (= run id) it has seen."""
        self.agents = agents
        for agent in agents.values():
            agent.runtime  # noqa: B018  # built once here: a bad harness fails the start
        self.verifier = verifier
        self.run_concurrency = run_concurrency
        self.run_timeout = run_timeout
        self.replicas = replicas
        self.tenant_limits = tenant_limits or TenantLimits()
        self.slots = Slots(
            running=asyncio.Semaphore(run_concurrency),
            parked=asyncio.Semaphore(run_concurrency * PARKED_PER_SLOT),
        )
        # Remembered cancels catch one that lands while a delivery is being admitted, between
        # its record read and the moment the run is held (queue.py `_may_run`).
        self.runs: RunCancels[LocalRun] = RunCancels(remember=CANCELS_REMEMBERED)
        self._api: ClientApi | None = None
        self._consumer: DurableConsumer | None = None
        self._cancel_sub: Subscription | None = None

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
            ack_wait=settings.run_ack_wait,
            retry_window=settings.run_retry_window,
            replicas=settings.stream_replicas,
            tenant_limits=limits,
            options=ServiceOptions(
                tracer_provider=tracer_provider, request_timeout=settings.request_timeout
            ),
        )

    def endpoints(self) -> list[Endpoint]:
        assert self._api is not None, "on_start builds the client API"
        return self._api.endpoints()

    async def on_start(self) -> None:
        for config in run_streams(self.replicas, self.duplicate_window):
            await ensure_stream(self.nc, config)
        records = await RunRecords.open(self.nc, replicas=self.replicas)
        approvals = await Approvals.open(self.nc, replicas=self.replicas)
        tenants = None
        if self.tenant_limits.any:
            tenants = await TenantSlots.open(
                self.nc, self.tenant_limits, lease=2 * self.ack_wait, replicas=self.replicas
            )
        ports = BusPorts(self.bus, approvals)
        self._api = ClientApi(
            self.nc, self.bus, self.verifier, records, approvals, agents=self.agents
        )
        queue = RunQueue(
            agents=self.agents,
            verifier=self.verifier,
            records=records,
            tenants=tenants,
            ports=ports,
            book=RunBook(self.bus, ports, records, self.agents, retry_window=self.retry_window),
            runs=self.runs,
            slots=self.slots,
            run_timeout=self.run_timeout,
            heartbeat=self.ack_wait / 3,
            tracer=self.tracer,
        )
        self._consumer = DurableConsumer(
            self.nc,
            run_consumer(self.ack_wait),
            queue.on_run,
            tracer=self.tracer,
            slots=self.slots.running,
        )
        self._cancel_sub = await self.nc.subscribe(subjects.CANCEL_ALL, cb=self.on_cancel)
        await self._consumer.start()

    async def on_draining(self) -> None:
        if self._cancel_sub is not None:
            with contextlib.suppress(nats.errors.ConnectionClosedError):
                await self._cancel_sub.unsubscribe()
        if self._consumer is None:
            return
        await self._consumer.stop_pulling()
        # Runs in flight may finish; what did not start stays queued for another replica, and
        # what is cut off here is redelivered (and resumed) elsewhere, since it was never acked.
        grace = self.stop_grace if self.nc.is_connected else 0.0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                for _ in range(self.run_concurrency):
                    await self.slots.running.acquire()
        await self._consumer.cut_off()

    async def on_cancel(self, msg: Msg) -> None:
        """Cancel the run this replica holds for that owner; another owner's run of the same
        id (there can be none: ids are claimed) is never touched."""
        self.runs.cancel_subject(msg.subject)
