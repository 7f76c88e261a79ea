"""The model router service: `runbus.model.complete` (route, check, call, stream deltas as run
events) and `runbus.model.usage` (the usage report); stops a run's stream when the run is
cancelled."""

import asyncio
import dataclasses
from pathlib import Path
from typing import Final, Self

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from runbus import blobs, ops, progress, subjects
from runbus.bus import heartbeats
from runbus.cancels import RunCancels, parse_cancel
from runbus.headers import RunContext
from runbus.messages import ModelRequest, ModelResponse, RunTextDelta
from runbus.messages.model import (
    ModelUsageQuery,
    ModelUsageReport,
)
from runbus.owners import Owner
from runbus.progress import Progress
from runbus.service import Endpoint, Service, ServiceOptions
from runbus.settings import Settings

from .backends import ModelBackend
from .config import RouterConfig, TargetConfig, load_config
from .core import Router
from .errors import RunCancelled
from .http_session import MAX_CONNECTIONS
from .ledger import KvLedger, KvProvenance, open_bucket
from .middleware import ChatMiddleware, Metrics, PromptAudit, Redactor, Tracing
from .openai_chat import OpenAIChatModel, OpenAIEndpoint, open_client, server_of
from .plugins import load_backends
from .routing import Target, build_table
from .server_health import ModelServer, ServerHealth, ServerWatch, http_probe
from .usage import report, utc_day

RECENT_CANCELS: Final = 1024
"""Cancelled runs remembered, so a call that arrives after its run's cancel is refused."""
CALLS_AT_ONCE: Final = MAX_CONNECTIONS
"""Model calls a replica serves at once: as many as it may open connections to one backend.
A call mostly waits on its provider, so the services' default of 256 (sized for handlers
that work) would let a gateway with 1000 runs in flight have at most 256 model calls out. A
target's `concurrency` still caps what one provider gets."""
ROUTER_OPTIONS: Final = ServiceOptions(max_concurrency=CALLS_AT_ONCE)


def _process_progress(service: str) -> Progress:
    """The process's progress when the runner made it for this service; else (in a test, in
    a process running several services) one of its own, which logs without publishing."""
    current = progress.current()
    return current if current.service == service else Progress(service)


class ModelRouterService(Service):
    name = "model_router"
    description = "Chooses a model per call, streams deltas, records usage"

    def __init__(
        self,
        nc: NATS,
        routes: dict[str, ModelBackend],
        *,
        config: RouterConfig | None = None,
        middleware: list[ChatMiddleware] | None = None,
        meter_provider: MeterProvider | None = None,
        stream_replicas: int = 1,
        options: ServiceOptions = ROUTER_OPTIONS,
        reporter: Progress | None = None,
    ) -> None:
        """`routes` are plug-in routes by name (`RUNBUS_MODEL_BACKENDS`, or test backends);
        `config` adds the routes file's backends, routes, rules and budgets. A model server
        that is down is reported to `reporter` (default: this process's progress)."""
        super().__init__(nc, options=options)
        self.config = config or RouterConfig()
        self.clients: dict[str, OpenAIEndpoint] = {}
        self.table = build_table(routes, self.config, self._openai_target)
        self.watch = self._watch_servers(reporter or _process_progress(self.name))
        audit = (
            [PromptAudit(Redactor(self.config.audit.redact))] if self.config.audit.enabled else []
        )
        self.middleware: list[ChatMiddleware] = [
            Tracing(self.tracer),
            Metrics(meter_provider),
            *(middleware or []),
            *audit,
        ]
        self.stream_replicas = stream_replicas
        self.router: Router | None = None
        self.ledger: KvLedger | None = None
        self.provenance: KvProvenance | None = None
        self._cancel_sub: Subscription | None = None
        self.cancels: RunCancels[asyncio.Task[ModelResponse]] = RunCancels(remember=RECENT_CANCELS)

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        config = load_config(Path(settings.model_routes)) if settings.model_routes else None
        return cls(
            nc,
            load_backends(settings),
            config=config,
            stream_replicas=settings.stream_replicas,
            options=dataclasses.replace(
                ROUTER_OPTIONS,
                tracer_provider=tracer_provider,
                request_timeout=settings.request_timeout,
            ),
        )

    def _openai_target(self, route: str, target: TargetConfig) -> Target:
        backend = self.config.backends[target.backend]
        client = self.clients.get(target.backend)
        if client is None:
            client = self.clients[target.backend] = open_client(target.backend, backend)
        model = OpenAIChatModel(
            client,
            model=target.model,
            config=backend,
            timeout=target.timeout,
            native_tools=target.native_tools,
            native_output=target.native_output,
        )
        return Target(
            key=f"{target.backend}/{target.model}",
            backend=model,
            model=target.model,
            family=backend.family,
            config=target,
            reasoning_field=backend.reasoning_field,
            server=server_of(client),
        )

    def _watch_servers(self, reporter: Progress) -> ServerWatch:
        """One health check per distinct server URL the routes call."""
        by_url: dict[str, list[str]] = {}
        for name, client in self.clients.items():
            by_url.setdefault(client.base_url, []).append(name)
        watched = []
        for names in by_url.values():
            client = self.clients[names[0]]
            routes = sorted(
                route
                for route, config in self.config.routes.items()
                if any(target.backend in names for target in config.targets)
            )
            server = ModelServer(url=client.shown_url, backends=tuple(names), routes=tuple(routes))
            health = ServerHealth(server, reporter)
            for name in names:
                self.clients[name].health = health
            watched.append((health, http_probe(client)))
        return ServerWatch(watched)

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint.for_op(ops.MODEL_COMPLETE, self.on_complete),
            Endpoint.for_op(ops.MODEL_USAGE, self.on_usage),
        ]

    async def on_start(self) -> None:
        kv = await open_bucket(self.nc, replicas=self.stream_replicas)
        self.ledger = KvLedger(kv, flush_every=self.config.usage_flush_seconds)
        self.ledger.start()
        self.provenance = KvProvenance(kv)
        self.router = Router(
            self.table,
            self.config,
            ledger=self.ledger,
            provenance=self.provenance,
            middleware=self.middleware,
        )
        self._cancel_sub = await self.nc.subscribe(subjects.CANCEL_ALL, cb=self.on_cancel)
        # In the background: a server that is down makes the router degraded, not late.
        self.watch.start()

    async def on_stop(self) -> None:
        if self._cancel_sub is not None:
            await self._cancel_sub.unsubscribe()
            self._cancel_sub = None
        if self.ledger is not None:
            await self.ledger.close()
        if self.provenance is not None:
            await self.provenance.close()
        await self.watch.stop()
        for client in self.clients.values():
            await client.close()

    async def on_cancel(self, msg: Msg) -> None:
        named = parse_cancel(msg.subject)
        if named is None:
            return
        if calls := self.cancels.cancel(*named):
            self.log.info("model_stream_cancelled", run_id=named[1], calls=calls)

    async def on_complete(self, ctx: RunContext, request: ModelRequest) -> ModelResponse:
        assert self.router is not None, "on_start has not run"
        # Calls and cancels are keyed by the run's owner: another owner's run of the same id
        # is never stopped by this one's cancel.
        owner = Owner.of(ctx)
        if ctx.run_id and self.cancels.cancelled(owner, ctx.run_id):
            raise RunCancelled(ctx.run_id)
        stream_to = request.stream_to
        message_id = request.message_id
        # Large parts travel by reference; the provider needs the bytes.
        request = msgspec.structs.replace(
            request, messages=await blobs.resolve(self.nc, request.messages)
        )

        async def on_delta(text: str) -> None:
            if stream_to:
                delta = RunTextDelta(run_id=ctx.run_id, message_id=message_id, delta=text)
                await self.bus.publish(stream_to, delta, ctx=ctx)

        # The call runs as its own task so a cancel of the run, or its caller going away (a
        # gateway that gave up, was cancelled or died), stops it and closes the provider's
        # stream, while this handler still answers with a typed error.
        call = asyncio.ensure_future(self.router.complete(ctx, request, on_delta))
        if not ctx.run_id:
            return await heartbeats(self.nc, ctx.progress, call, on_gone=self._log_abandoned)
        try:
            with self.cancels.holding(owner, ctx.run_id, call):
                response = await heartbeats(
                    self.nc, ctx.progress, call, on_gone=self._log_abandoned
                )
            if stream_to and response.finish_reason == "length":
                # A reader of the stream learns the text was cut, not finished.
                cut = RunTextDelta(
                    run_id=ctx.run_id, message_id=message_id, delta="", finish_reason="length"
                )
                await self.bus.publish(stream_to, cut, ctx=ctx)
            return response
        except asyncio.CancelledError:
            current = asyncio.current_task()
            cancelled = self.cancels.cancelled(owner, ctx.run_id)
            if cancelled and current is not None and not current.cancelling():
                raise RunCancelled(ctx.run_id) from None
            raise

    def _log_abandoned(self) -> None:
        self.log.info("model_call_abandoned", reason="the caller stopped listening")

    async def on_usage(self, ctx: RunContext, query: ModelUsageQuery) -> ModelUsageReport:
        assert self.ledger is not None, "on_start has not run"
        day = query.day or utc_day()
        rows = await self.ledger.rows(day, query.tenant or None)
        return report(self.config, day, rows)
