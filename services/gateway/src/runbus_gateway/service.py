"""The gateway service: pulls run requests from the durable work queue, authenticates them,
runs them (`loop.execute_run`) and publishes their events. Replicas share one consumer."""

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Final, Self

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode

from runbus import headers as h
from runbus import subjects
from runbus.errors import InternalError, RunbusError, UnknownAgent
from runbus.messages import RunFailed, RunRequest, is_identifier
from runbus.messages.runs import RUN_REQUEST_DECODER
from runbus.service import Service, as_runbus_error
from runbus.settings import Settings
from runbus.telemetry import extract

from .agents import AgentSpec, load_agents
from .auth import TokenVerifier
from .errors import AgentMismatch
from .loop import execute_run
from .ports import BusPorts

DUPLICATE_WINDOW: Final = 600.0
ACK_WAIT: Final = 30.0
MAX_DELIVER: Final = 5
EVENTS_MAX_AGE: Final = 3600.0
PULL_WAIT: Final = 5.0


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
        **kwargs: object,
    ) -> None:
        super().__init__(nc, **kwargs)  # type: ignore[arg-type]
        self.agents = agents
        self.verifier = verifier
        self.run_concurrency = run_concurrency
        self.run_timeout = run_timeout
        self.ports = BusPorts(self.bus)
        self._pull_task: asyncio.Task[None] | None = None
        self._run_slots = asyncio.Semaphore(run_concurrency)
        self._stopping = asyncio.Event()

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(
            nc,
            agents=load_agents(Path(settings.agents_dir) if settings.agents_dir else None),
            verifier=TokenVerifier.from_file(
                Path(settings.tokens_file) if settings.tokens_file else None
            ),
            run_concurrency=settings.run_concurrency,
            run_timeout=settings.run_timeout,
            tracer_provider=tracer_provider,
            request_timeout=settings.request_timeout,
        )

    async def on_start(self) -> None:
        js = self.nc.jetstream()
        for config in (
            StreamConfig(
                name=subjects.RUNS_STREAM,
                subjects=[subjects.RUNS_ALL],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW,
            ),
            StreamConfig(
                name=subjects.EVENTS_STREAM,
                subjects=[subjects.EVENTS_ALL],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=EVENTS_MAX_AGE,
            ),
        ):
            try:
                await js.add_stream(config)
            except BadRequestError:
                await js.update_stream(config)
        self._subscription = await js.pull_subscribe(
            subjects.RUNS_ALL,
            durable=subjects.RUNS_CONSUMER,
            stream=subjects.RUNS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ACK_WAIT,
                max_deliver=MAX_DELIVER,
                max_ack_pending=-1,
            ),
        )
        self._pull_task = asyncio.create_task(self._pull_runs())

    async def on_stop(self) -> None:
        self._stopping.set()
        if self._pull_task is not None:
            self._pull_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pull_task
        # Runs in flight finish; what did not start stays in the queue for another replica.
        for _ in range(self.run_concurrency):
            await self._run_slots.acquire()

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
        """One delivery of a run request: decode, authenticate, execute, publish, ack."""
        headers = msg.headers or {}
        run_id = headers.get(h.MSG_ID, "")
        with self.tracer.start_as_current_span(
            "process " + subjects.RUNS_TEMPLATE,
            context=extract(headers),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "messaging.operation.type": "process",
            },
        ) as span:
            heartbeat = asyncio.create_task(self._heartbeat(msg))
            try:
                request = self._admit(msg)
                run_id = request.run_id
                principal = self.verifier.verify(headers.get(h.AUTH))
                agent = self.agents.get(request.agent)
                if agent is None:
                    raise UnknownAgent(f"no agent named {request.agent!r}")
                ctx = h.RunContext(
                    run_id=run_id,
                    session_id=request.session_id,
                    agent=agent.name,
                    props={
                        "user_id": principal.user_id,
                        "tenant": principal.tenant,
                        "request_id": run_id,
                    },
                    deadline=time.time() + self.run_timeout,
                )
                span.set_attributes({"gen_ai.agent.name": agent.name, "runbus.run_id": run_id})
                with self.tracer.start_as_current_span(
                    f"invoke_agent {agent.name}",
                    attributes={
                        "gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.name": agent.name,
                        "gen_ai.conversation.id": request.session_id,
                    },
                ):
                    self.log.info(
                        "run_started",
                        run_id=run_id,
                        agent=agent.name,
                        user_id=principal.user_id,
                        tenant=principal.tenant,
                    )
                    completed = await execute_run(request, agent, ctx, self.ports)
                    await self.ports.emit(ctx, completed)
                    self.log.info(
                        "run_completed", run_id=run_id, output_tokens=completed.usage.output_tokens
                    )
            except Exception as exc:
                error = as_runbus_error(exc)
                span.set_status(Status(StatusCode.ERROR, error.message))
                span.set_attribute("error.type", error.code)
                if isinstance(error, InternalError):
                    self.log.exception("run_failed", run_id=run_id)
                else:
                    self.log.info(
                        "run_failed", run_id=run_id, code=error.code, reason=error.message
                    )
                await self._publish_failure(run_id, error)
            finally:
                heartbeat.cancel()
            await msg.ack()

    def _admit(self, msg: Msg) -> RunRequest:
        request = RUN_REQUEST_DECODER.decode(msg.data)
        subject_agent = msg.subject.rsplit(".", 1)[-1]
        if subject_agent != request.agent:
            raise AgentMismatch(subject_agent, request.agent)
        return request

    async def _publish_failure(self, run_id: str, error: RunbusError) -> None:
        if not is_identifier(run_id):
            # Not a subject-safe id: there is no events subject a client could be reading.
            self.log.info("run_failure_not_published", reason="no usable run id")
            return
        ctx = h.RunContext(run_id=run_id)
        await self.ports.emit(ctx, RunFailed(run_id=run_id, error=error.to_info()))

    async def _heartbeat(self, msg: Msg) -> None:
        """Tell JetStream the run is alive so a long run is not redelivered meanwhile."""
        while True:
            await asyncio.sleep(ACK_WAIT / 3)
            with contextlib.suppress(Exception):
                await msg.in_progress()
