"""The memory service: store under the full storage scope (request/reply, or off the run's path
through the `runbus.memory.writes` stream), search in the agent's search scope, answer the
`memory_search` tool with the scope forced, and list / forget / count a user's memories."""

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Self

import msgspec
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from runbus import ops, progress, subjects
from runbus.consumer import ConsumerSpec, Delivery, DurableConsumer
from runbus.errors import (
    BadRequest,
    InternalError,
    NotFound,
    RemoteError,
    RunbusError,
    Unauthenticated,
)
from runbus.headers import RunContext
from runbus.jetstream import ensure_stream
from runbus.messages import FunctionResultContent, ModelRequest, ToolInvoke, ToolInvoked
from runbus.messages.memory import (
    MEMORY_SEARCH_TOOL,
    MEMORY_STORE_PROP,
    MEMORY_STORE_ROUTE_PROP,
    MemoryForget,
    MemoryForgotten,
    MemoryHit,
    MemoryHits,
    MemoryList,
    MemoryListed,
    MemorySearch,
    MemoryStatistics,
    MemoryStats,
    MemoryStore,
    MemoryStored,
)
from runbus.service import DEFAULT_OPTIONS, Endpoint, Service, ServiceOptions, as_runbus_error
from runbus.settings import Settings

from . import reconcile
from .core import (
    MemoryRecord,
    StorageScope,
    forget_selector,
    records_to_store,
    relevance_threshold,
    search_match,
    tool_search,
)
from .embedder import Embedder, LazyEmbedder, embedder_from_settings
from .errors import FindOutsideOwnScope, StoreNotConfigured
from .locks import UserLocks
from .memories import Memories
from .reembed import open_edge
from .stores import MemoryStore as Store

WRITES_MAX_AGE: Final = 7 * 24 * 3600.0
"""A write nobody could store for a week is dropped (a store that long down is an incident)."""
DUPLICATE_WINDOW: Final = 600.0
"""Publishes with the same `Nats-Msg-Id` within this window are stored once by JetStream."""
ACK_WAIT: Final = 30.0
WRITE_BATCH: Final = 64
"""Writes embedded and upserted together at most."""
RETRY_DELAYS: Final = (1.0, 2.0, 5.0, 15.0, 60.0)
"""Backoff of a write that failed to store, by delivery; the last one repeats. There is no
delivery limit: a write waits out an embedder or store outage instead of being lost."""
FETCH_TURNS: Final = 8
EXTRACTION_TIMEOUT: Final = 120.0
"""Seconds the model policy's extraction call may take (a local model on a CPU is slow); the
write is kept in progress meanwhile, so its ack wait does not run out."""
PERMANENT: Final = frozenset({"bad_request", "not_found", "unauthenticated", "message_too_large"})
"""Error codes of a model call that a retry will not cure (an unknown route): the write is
dropped and logged, not retried."""
SETTLE_WAIT: Final = 0.5
"""Seconds a search waits for writes this replica already holds, so a fact stated in one run
is found by the next one (read-your-writes within a replica)."""


class MemoryService(Service):
    name = "memory"
    description = "Long-term semantic memory in Qdrant"

    def __init__(
        self,
        nc: NATS,
        *,
        embedder: Embedder | None = None,
        embedder_factory: Callable[[], Awaitable[Embedder]] | None = None,
        store: Store | None = None,
        qdrant_url: str | None = None,
        data_dir: Path | None = None,
        replicas: int = 1,
        write_ack_wait: float = ACK_WAIT,
        warm_embedder: bool = False,
        options: ServiceOptions = DEFAULT_OPTIONS,
    ) -> None:
        """`embedder` (or `embedder_factory`, awaited at start); `store` wins (tests inject
        one), else a Qdrant server at `qdrant_url`, else the embedded shard in `data_dir`.
        `replicas`: of the writes stream; `write_ack_wait`: seconds before an unacked write
        (its replica died) is delivered again; `warm_embedder`: load a lazy embedder's model
        in the background at start rather than at the first search."""
        super().__init__(nc, options=options)
        if embedder is None and embedder_factory is None:
            raise TypeError("MemoryService needs an embedder or an embedder_factory")
        self.embedder = embedder
        self.embedder_factory = embedder_factory
        self.store = store
        self.qdrant_url = qdrant_url
        self.data_dir = data_dir
        self.replicas = replicas
        self.write_ack_wait = write_ack_wait
        self.warm_embedder = warm_embedder
        self._memories: Memories | None = None
        self._writes: DurableConsumer | None = None
        self._store_task: asyncio.Task[None] | None = None
        self._warming: asyncio.Task[None] | None = None
        self._inbox: asyncio.Queue[QueuedWrite] = asyncio.Queue()
        self._writing: asyncio.Future[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._unscoped_logged: set[str] = set()
        self._reconciling: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        """A lock per user with model-policy writes in hand, and how many are waiting."""
        self._locks: UserLocks | None = None
        """The users' locks shared by every replica (taken after this replica's own)."""

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        async def load_embedder() -> Embedder:
            return await embedder_from_settings(settings)

        return cls(
            nc,
            embedder_factory=load_embedder,
            qdrant_url=settings.qdrant_url,
            data_dir=settings.data_path / "qdrant",
            replicas=settings.stream_replicas,
            warm_embedder=settings.embedder_warm,
            options=ServiceOptions(
                tracer_provider=tracer_provider, request_timeout=settings.request_timeout
            ),
        )

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint.for_op(ops.MEMORY_STORE, self.on_store),
            Endpoint.for_op(ops.MEMORY_SEARCH, self.on_search),
            Endpoint.for_op(ops.MEMORY_FIND, self.on_find),
            Endpoint.for_op(ops.MEMORY_LIST, self.on_list),
            Endpoint.for_op(ops.MEMORY_FORGET, self.on_forget),
            Endpoint.for_op(ops.MEMORY_STATS, self.on_stats),
            Endpoint.for_op(ops.TOOL_INVOKE.at(MEMORY_SEARCH_TOOL.name), self.on_tool_search),
        ]

    # -- start and stop -------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.embedder is None:
            assert self.embedder_factory is not None
            progress.report("preparing the embedder")
            self.embedder = await self.embedder_factory()
        if self.store is None:
            dimension, name = self.embedder.dimension, self.embedder.name
            self.store = await progress.retrying(
                "opening the memory store",
                lambda: self._open_store(dimension, name),
                down=self._store_down,
            )
        self._memories = Memories(self.embedder, self.store)
        if self.warm_embedder and isinstance(self.embedder, LazyEmbedder):
            # In the background: ready at once, and the first search does not pay the load.
            self._warming = asyncio.create_task(self.embedder.warm())
        config = StreamConfig(
            name=subjects.MEMORY_WRITES_STREAM,
            subjects=[subjects.MEMORY_WRITES],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=WRITES_MAX_AGE,
            duplicate_window=DUPLICATE_WINDOW,
            num_replicas=self.replicas,
        )
        await ensure_stream(self.nc, config)
        self._locks = await UserLocks.open(self.nc, replicas=self.replicas)
        spec = ConsumerSpec(
            stream=subjects.MEMORY_WRITES_STREAM,
            durable=subjects.MEMORY_WRITES_CONSUMER,
            subject=subjects.MEMORY_WRITES,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.write_ack_wait,
                max_deliver=-1,
                max_ack_pending=-1,
            ),
            span_name=f"process {subjects.MEMORY_WRITES}",
        )
        # Bounded: a backlog stays in the stream, not in this process, where its ack wait
        # would run out before the writer got to it.
        slots = asyncio.Semaphore(WRITE_BATCH)
        self._writes = DurableConsumer(
            self.nc, spec, self.on_write, tracer=self.tracer, slots=slots
        )
        self._store_task = asyncio.create_task(self._store_writes())
        await self._writes.start()

    async def _open_store(self, dimension: int, embedder: str) -> Store:
        if self.qdrant_url:
            from .qdrant import QdrantClientStore  # only a deployment with a server pays for it

            return await QdrantClientStore.open(dimension, url=self.qdrant_url, embedder=embedder)
        if self.data_dir is None:
            raise StoreNotConfigured()
        assert self.embedder is not None
        # A shard another embedder made has its memories embedded again (reembed.py).
        return await open_edge(self.data_dir, self.embedder)

    def _store_down(self, exc: Exception) -> str | None:
        """Why a Qdrant server cannot be used yet, if it is unreachable (retried); None for a
        refusal that waiting will not cure (another embedder's collection)."""
        if not self.qdrant_url or isinstance(exc, RunbusError):
            return None
        cause = exc.__cause__ or exc.__context__ or exc
        return (
            f"Qdrant at {self.qdrant_url} (RUNBUS_QDRANT_URL): {str(cause) or type(cause).__name__}"
        )

    async def on_stop(self) -> None:
        if self._writes is not None:
            await self._writes.stop_pulling()
        if self._store_task is not None:
            self._store_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._store_task
        if self._writing is not None:
            with contextlib.suppress(Exception):
                await self._writing  # the batch being stored is stored and acked
        # Writes not started yet go back to the stream at once, for another replica.
        while not self._inbox.empty():
            write = self._inbox.get_nowait()
            with contextlib.suppress(Exception):
                await write.delivery.retry(0)
            write.done.set()
        self._idle.set()
        if self.store is not None:
            await self.store.close()
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        if self.embedder is not None:
            await self.embedder.close()

    @property
    def memories(self) -> Memories:
        assert self._memories is not None, "start() opens the embedder and the store"
        return self._memories

    # -- request/reply --------------------------------------------------------------------

    async def on_store(self, ctx: RunContext, request: MemoryStore) -> MemoryStored:
        scope = StorageScope.from_context(ctx)
        records = records_to_store(scope, request)
        if ctx.prop(MEMORY_STORE_PROP) == "model":
            write_id = ctx.run_id or str(uuid.uuid4())
            texts = [r.text for r in records]
            async with self._user_lock(scope):
                plan = await self._remember(ctx, scope, texts, write_id, datetime.now(UTC))
            return MemoryStored(memory_ids=[r.memory_id for r in plan.stored])
        await self.memories.upsert(records)
        return MemoryStored(memory_ids=[r.memory_id for r in records])

    async def on_search(self, ctx: RunContext, request: MemorySearch) -> MemoryHits:
        scope = StorageScope.from_context(ctx)
        match = search_match(scope, request.scope, request.match)
        if match is None:
            self._log_unscoped(ctx.agent)
            return MemoryHits(hits=[])
        await self._settle_writes()
        threshold = relevance_threshold(self.memories.embedder.name, request.min_score)
        found = await self.memories.search(request.query, match, request.limit, threshold)
        return MemoryHits(hits=[_hit(record, score) for record, score in found])

    async def on_find(self, ctx: RunContext, request: MemorySearch) -> MemoryHits:
        """A client searching its own memories (`runbus memory search`): user scope only."""
        if request.scope != "user" or request.match not in (None, ["user_id"]):
            raise FindOutsideOwnScope()
        # A person looking through their own memories sees every match, ranked.
        min_score = -1.0 if request.min_score is None else request.min_score
        return await self.on_search(
            ctx, msgspec.structs.replace(request, match=None, min_score=min_score)
        )

    async def on_list(self, ctx: RunContext, request: MemoryList) -> MemoryListed:
        records, cursor = await self.memories.scroll(
            StorageScope.from_context(ctx),
            request.session_id,
            request.limit,
            request.cursor,
            retired=request.include_retired,
        )
        return MemoryListed(memories=[_hit(r, 1.0) for r in records], next_cursor=cursor)

    async def on_forget(self, ctx: RunContext, request: MemoryForget) -> MemoryForgotten:
        scope = StorageScope.from_context(ctx)
        match forget_selector(request):
            case ("ids", list(memory_ids)):
                forgotten = await self.memories.forget_ids(scope, memory_ids)
            case ("session", str(session_id)):
                forgotten = await self.memories.forget_session(scope, session_id)
            case _:
                forgotten = await self.memories.forget_user(scope)
        self.log.info(
            "memories_forgotten",
            tenant=scope.tenant,
            user_id=scope.user_id,
            forgotten=forgotten,
            by="ids" if request.memory_ids else "session" if request.session_id else "user",
        )
        return MemoryForgotten(forgotten=forgotten)

    async def on_stats(self, ctx: RunContext, request: MemoryStats) -> MemoryStatistics:
        scope = StorageScope.from_context(ctx)
        pending = 0
        if self._writes is not None:
            info = await self._writes.consumer_info()
            pending = (info.num_pending or 0) + (info.num_ack_pending or 0)
        return MemoryStatistics(
            memories=await self.memories.count(scope),
            embedder=self.memories.embedder.name,
            dimension=self.memories.embedder.dimension,
            store=self.memories.store.kind,
            pending_writes=pending,
        )

    async def on_tool_search(self, ctx: RunContext, request: ToolInvoke) -> ToolInvoked:
        """`memory_search` for a model: the query is the model's, nothing else is."""
        if request.name != MEMORY_SEARCH_TOOL.name:
            raise BadRequest(
                f"this endpoint runs {MEMORY_SEARCH_TOOL.name!r}, not {request.name!r}"
            )
        if not request.call_id:
            raise BadRequest("call_id must not be empty")
        scope = StorageScope.from_context(ctx)
        with self.tracer.start_as_current_span(
            f"execute_tool {MEMORY_SEARCH_TOOL.name}",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": MEMORY_SEARCH_TOOL.name,
                "gen_ai.tool.call.id": request.call_id,
            },
        ) as span:
            try:
                search = tool_search(scope, ctx, request.arguments)
            except ValueError as exc:
                span.set_attribute("error.type", "tool_error")
                return ToolInvoked(
                    result=FunctionResultContent(call_id=request.call_id, error=str(exc))
                )
            if search.discarded:
                self.log.warning(
                    "tool_argument_discarded",
                    tool=MEMORY_SEARCH_TOOL.name,
                    arguments=list(search.discarded),
                )
            await self._settle_writes()
            threshold = relevance_threshold(self.memories.embedder.name, search.min_score)
            found = await self.memories.search(search.query, search.match, search.limit, threshold)
        memories = [
            {"text": r.text, "stored_at": r.created_at.isoformat(), "score": round(score, 3)}
            for r, score in found
        ]
        return ToolInvoked(
            result=FunctionResultContent(call_id=request.call_id, result={"memories": memories})
        )

    def _log_unscoped(self, agent: str) -> None:
        if agent not in self._unscoped_logged:
            self._unscoped_logged.add(agent)
            self.log.warning("memory_search_without_scope", agent=agent)

    # -- writes off the run's path ------------------------------------------------------

    async def on_write(self, delivery: Delivery) -> None:
        """One queued write (under its consumer span): refused at once if it can never be
        stored, else handed to the writer; its slot is held until it is stored or retried. A
        write of the model policy is extracted and reconciled on its own."""
        records = await self._prepare(delivery)
        if records is None:
            return
        ctx = RunContext.from_headers(delivery.headers)
        if ctx.prop(MEMORY_STORE_PROP) == "model":
            await self._extract(delivery, ctx, [r.text for r in records])
            return
        write = QueuedWrite(delivery=delivery, records=records)
        await self._inbox.put(write)
        await write.done.wait()

    async def _extract(self, delivery: Delivery, ctx: RunContext, texts: list[str]) -> None:
        """A write of the model policy, on its own (a model call is too slow to batch): the
        facts extracted, checked and reconciled, then acked. A replay of a write that reached
        the store does nothing; a model or store that failed for a passing reason is retried."""
        metadata = delivery.msg.metadata
        # Stamped with the publish time and keyed by the run, so a replay plans the same.
        at = metadata.timestamp or datetime.now(UTC)
        write_id = ctx.run_id or f"stream-{metadata.sequence.stream}"
        scope = StorageScope.from_context(ctx)
        keep_alive = asyncio.create_task(self._keep_in_progress(delivery))
        try:
            # One user's writes are reconciled one at a time, across replicas too: each sees
            # what the last stored, and a write delivered twice at once (to two replicas) is
            # applied by the first and skipped after.
            async with self._user_lock(scope):
                await self._remember(ctx, scope, texts, write_id, at)
        except reconcile.ExtractionInvalid as exc:
            self.log.warning("memory_extraction_invalid", run_id=ctx.run_id, problem=exc.problem)
        except Exception as exc:
            error = as_runbus_error(exc)
            if _permanent(error):
                self.log.warning(
                    "memory_write_refused", run_id=ctx.run_id, code=error.code, reason=str(exc)
                )
                await delivery.term()
            else:
                await self._retry_later(delivery)
        finally:
            keep_alive.cancel()

    async def _remember(
        self, ctx: RunContext, scope: StorageScope, texts: list[str], write_id: str, at: datetime
    ) -> reconcile.Plan:
        """Extract the user's facts from `texts` with the model on the write's route, check
        them, reconcile them with the user's nearest memories and store the plan in one
        upsert. Keyed by `write_id` (the run): a write already applied is not applied again."""
        route = ctx.prop(MEMORY_STORE_ROUTE_PROP)
        if not route:
            raise BadRequest(f"rb-prop-{MEMORY_STORE_ROUTE_PROP} names no route to extract with")
        if await self.memories.applied(scope, write_id):
            self.log.info("memory_write_replayed", run_id=ctx.run_id)
            return reconcile.Plan(decisions=[], records=[])
        candidates = await self.memories.nearest(scope, texts, reconcile.CANDIDATES)
        request = ModelRequest(
            route=route,
            messages=reconcile.prompt(texts, candidates),
            response_format=reconcile.OUTPUT,
            temperature=0.0,
        )
        with self.tracer.start_as_current_span(
            f"extract_memories {route}",
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": route},
        ):
            reply = await self.bus.call(
                ops.MODEL_COMPLETE, request, ctx=ctx, timeout=EXTRACTION_TIMEOUT
            )
        facts = reconcile.parse(reply.message.text)
        plan = reconcile.plan(facts, candidates, scope, write_id, at, texts)
        await self.memories.upsert(plan.records)
        self.log.info(
            "memories_reconciled",
            run_id=ctx.run_id,
            route=reply.route or route,
            facts=len(facts),
            added=sum(d.action == "add" for d in plan.decisions),
            updated=sum(d.action == "update" for d in plan.decisions),
            deleted=sum(d.action == "delete" for d in plan.decisions),
            unchanged=sum(d.action == "none" for d in plan.decisions),
            refused=[d.verdict for d in plan.decisions if d.action == "refused"],
        )
        return plan

    @contextlib.asynccontextmanager
    async def _user_lock(self, scope: StorageScope) -> AsyncIterator[None]:
        """One user's reconciling, one at a time: first among this replica's writes (in the
        order they came), then across replicas (the shared lock)."""
        key = (scope.tenant, scope.user_id)
        lock, holders = self._reconciling.get(key, (asyncio.Lock(), 0))
        self._reconciling[key] = (lock, holders + 1)
        try:
            async with lock:
                if self._locks is None:
                    yield
                else:
                    async with self._locks.hold(scope.tenant, scope.user_id):
                        yield
        finally:
            lock, holders = self._reconciling[key]
            if holders == 1:
                del self._reconciling[key]
            else:
                self._reconciling[key] = (lock, holders - 1)

    async def _keep_in_progress(self, delivery: Delivery) -> None:
        while True:
            await asyncio.sleep(self.write_ack_wait / 3)
            with contextlib.suppress(Exception):
                await delivery.in_progress()

    async def _store_writes(self) -> None:
        """Store what the consumer handed over, up to `WRITE_BATCH` writes per embed + upsert."""
        while True:
            batch = [await self._inbox.get()]
            while not self._inbox.empty() and len(batch) < WRITE_BATCH:
                batch.append(self._inbox.get_nowait())
            self._idle.clear()
            try:
                # Shielded: a stop lets the batch be stored and acked.
                self._writing = asyncio.ensure_future(self._write(batch))
                await asyncio.shield(self._writing)
            except Exception:
                # An ack that could not be sent (the connection is going): what was not acked
                # is delivered again; the writer keeps going.
                self.log.exception("memory_write_batch_failed", writes=len(batch))
            finally:
                for write in batch:
                    write.done.set()
                if self._inbox.empty():
                    self._idle.set()

    async def _write(self, batch: list["QueuedWrite"]) -> None:
        try:
            await self.memories.upsert([r for write in batch for r in write.records])
        except Exception:
            if len(batch) == 1:
                await self._retry_later(batch[0].delivery)
                return
            # One bad write must not hold back the others: store them one by one.
            for write in batch:
                try:
                    await self.memories.upsert(write.records)
                except Exception:
                    await self._retry_later(write.delivery)
                else:
                    await write.delivery.ack()
            return
        for write in batch:
            await write.delivery.ack()

    async def _prepare(self, delivery: Delivery) -> list[MemoryRecord] | None:
        """The records a queued write makes; a write that can never be stored (a bad body,
        no identity, a refused source) is terminated, logged, and None."""
        ctx = RunContext.from_headers(delivery.headers)
        try:
            request = ops.MEMORY_STORE.decode.decode(delivery.msg.data)
            return records_to_store(StorageScope.from_context(ctx), request)
        except Exception as exc:
            error = as_runbus_error(exc)
            span = trace.get_current_span()
            span.set_status(Status(StatusCode.ERROR, error.message))
            span.set_attribute("error.type", error.code)
            if isinstance(error, InternalError):
                self.log.exception("memory_write_refused", run_id=ctx.run_id)
            else:
                self.log.warning(
                    "memory_write_refused",
                    run_id=ctx.run_id,
                    code=error.code,
                    reason=error.message,
                )
            await delivery.term()
            return None

    async def _retry_later(self, delivery: Delivery) -> None:
        delay = RETRY_DELAYS[min(delivery.attempt, len(RETRY_DELAYS)) - 1]
        self.log.exception(
            "memory_write_failed",
            run_id=RunContext.from_headers(delivery.headers).run_id,
            delivery=delivery.attempt,
            retry_in=delay,
        )
        await delivery.retry(delay)

    async def _settle_writes(self) -> None:
        """Wait (briefly) for writes this replica holds: in its inbox, being stored, or
        delivered to its connection and not yet fetched."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WAIT
        # A write taken off the connection is inside `fetch` for a few loop turns before the
        # puller hands it on; let those turns pass first.
        for _ in range(FETCH_TURNS):
            await asyncio.sleep(0)
        while loop.time() < deadline:
            if not self._idle.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), deadline - loop.time())
            elif self._writes is not None and self._writes.pending_msgs > 0:
                await asyncio.sleep(0.001)
            else:
                return


def _hit(record: MemoryRecord, score: float) -> MemoryHit:
    return MemoryHit(
        memory_id=record.memory_id,
        text=record.text,
        score=score,
        session_id=record.scope.session_id,
        created_at=record.created_at,
        agent_id=record.scope.agent_id,
        application_id=record.scope.application_id,
        status=record.status,
        superseded_by=record.superseded_by,
        retired_at=record.retired_at,
    )


def _permanent(error: RunbusError) -> bool:
    """A failure that retrying the write will not cure."""
    if isinstance(error, RemoteError):
        return error.remote_code in PERMANENT
    return isinstance(error, BadRequest | NotFound | Unauthenticated)


class QueuedWrite:
    """A write handed to the batch writer; `done` is set once it is stored or retried."""

    def __init__(self, delivery: Delivery, records: list[MemoryRecord]) -> None:
        self.delivery = delivery
        self.records = records
        self.done = asyncio.Event()
