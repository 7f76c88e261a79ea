"""The authenticated client API (`runbus.api.*`): runs and approvals answered here, everything
else forwarded to the owning service with the caller's identity as trusted headers."""

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC
from typing import Any, Final

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from runbus import headers as h
from runbus import ops, subjects
from runbus.bus import Bus
from runbus.decoding import decode_untrusted
from runbus.errors import NotFound, RunbusError
from runbus.messages import FunctionResultContent
from runbus.messages.runs import (
    RUN_REQUEST_DECODER,
    AgentList,
    AgentListed,
    AgentSummary,
    ApprovalDecide,
    ApprovalDecided,
    ClientToolAnswer,
    ClientToolAnswered,
    RunCancel,
    RunEdit,
    RunFork,
    RunForked,
    RunGet,
    RunInfo,
    RunList,
    RunListed,
    RunPause,
    RunPending,
    RunPendingGet,
    RunRecord,
    RunResume,
)
from runbus.owners import Owner
from runbus.service import RAW_DECODER, Endpoint
from runbus.tokens import Principal, TokenVerifier, msg_run_id

from .agents import AgentSpec
from .approvals import Approvals
from .client_calls import ClientCalls
from .errors import RunCancelled
from .event_stream import EventStream
from .pauses import Pauses
from .run.events import RunEvents
from .run_control import RunControl
from .runs import RunRecords, now

log = structlog.get_logger()

QUEUE_RECENT: Final = 32
"""Newest run requests a lookup reads one by one before it reads the queue from its start."""
QUEUE_SCAN_LIMIT: Final = 10_000
"""Most run requests a lookup of an unknown run id reads from the queue: the run queue holds
only requests not yet finished, so this is far past any healthy queue's depth."""


class ClientApi:
    def __init__(
        self,
        nc: NATS,
        bus: Bus,
        verifier: TokenVerifier,
        records: RunRecords,
        approvals: Approvals,
        *,
        agents: dict[str, AgentSpec],
    ) -> None:
        self.nc = nc
        self.agents = agents
        self.bus = bus
        self.verifier = verifier
        self.records = records
        self.approvals = approvals
        self.client_calls = ClientCalls(approvals.bucket.kv)
        self.control = RunControl(bus, records, Pauses(approvals.bucket.kv), agents)
        self.events = EventStream(bus)

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint.for_op(ops.API_RUNS_GET, self.on_run_get),
            Endpoint.for_op(ops.API_RUNS_LIST, self.on_run_list),
            Endpoint.for_op(ops.API_RUNS_CANCEL, self.on_run_cancel),
            Endpoint.for_op(ops.API_APPROVALS_DECIDE, self.on_approval_decide),
            Endpoint.for_op(ops.API_CLIENT_TOOLS_ANSWER, self.on_client_tool_answer),
            Endpoint.for_op(ops.API_AGENTS_LIST, self.on_agent_list),
            Endpoint.for_op(ops.API_RUNS_PAUSE, self.on_run_pause),
            Endpoint.for_op(ops.API_RUNS_PENDING, self.on_run_pending),
            Endpoint.for_op(ops.API_RUNS_EDIT, self.on_run_edit),
            Endpoint.for_op(ops.API_RUNS_RESUME, self.on_run_resume),
            Endpoint.for_op(ops.API_RUNS_FORK, self.on_run_fork),
            *(Endpoint.forwarder(op, self._forwarder(op)) for op in ops.FORWARDED),
        ]

    def _principal(self, ctx: h.RunContext) -> Principal:
        return self.verifier.verify(ctx.auth)

    def _trusted(self, principal: Principal) -> h.RunContext:
        # Built from the verified principal only: rb-prop-* headers a client sent are ignored.
        return h.RunContext(
            props={"user_id": principal.user_id, "tenant": principal.tenant},
            deadline=time.time() + self.bus.request_timeout,
        )

    def _forwarder(
        self, op: ops.Op[Any, Any]
    ) -> Callable[[h.RunContext, msgspec.Raw], Awaitable[msgspec.Raw]]:
        # The body goes on unread: the owning service decodes it and checks it.
        async def forward(ctx: h.RunContext, body: msgspec.Raw) -> msgspec.Raw:
            trusted = self._trusted(self._principal(ctx))
            return await self.bus.request(op.subject, body, RAW_DECODER, ctx=trusted)

        return forward

    async def on_agent_list(self, ctx: h.RunContext, request: AgentList) -> AgentListed:
        """The agents a caller may run: every agent this gateway has, to any known user."""
        self._principal(ctx)
        return AgentListed(
            agents=[
                AgentSummary(
                    name=name, description=agent.description, client_tools=agent.client_tools
                )
                for name, agent in sorted(self.agents.items())
            ]
        )

    async def on_run_get(self, ctx: h.RunContext, request: RunGet) -> RunInfo:
        """The caller's run: its record, or `queued` while its request waits in the queue for a
        replica to admit it (a run is there from the moment JetStream accepted its request)."""
        principal = self._principal(ctx)
        record = await self.records.get(principal.tenant, principal.user_id, request.run_id)
        if record is None:
            record = await self._queued(principal, request.run_id)
        if record is None:
            raise NotFound(f"no run {request.run_id!r}")
        if record.status != "waiting_approval":
            return RunInfo(record=record)
        pending = await self.approvals.pending(record.tenant, record.user_id, record.run_id)
        return RunInfo(record=record, pending_approvals=pending)

    async def _queued(self, principal: Principal, run_id: str) -> RunRecord | None:
        """The record of the caller's request `run_id` while it is still in the run queue; None
        when there is none, or it is someone else's (its own token names its owner)."""
        async for msg in self._queue():
            stored = msg.headers or {}
            if msg_run_id(stored.get(h.MSG_ID, "")) != run_id:
                continue
            try:
                owner = self.verifier.verify(stored.get(h.AUTH))
                queued = decode_untrusted(RUN_REQUEST_DECODER, msg.data or b"", "run request")
            except RunbusError:
                continue  # admission will fail it and tell its sender
            if (owner.tenant, owner.user_id) != (principal.tenant, principal.user_id):
                continue
            accepted = (msg.time or now()).astimezone(UTC)
            parent = stored.get(h.TRACEPARENT, "").split("-")
            return RunRecord(
                run_id=run_id,
                agent=queued.agent,
                session_id=queued.session_id,
                tenant=owner.tenant,
                user_id=owner.user_id,
                status="queued",
                created_at=accepted,
                updated_at=accepted,
                attempts=0,
                trace_id=parent[1] if len(parent) == 4 else "",
            )
        return None

    async def _queue(self) -> AsyncIterator[RawStreamMsg]:
        """The run requests in the queue: the newest few first (a run asked about before a
        replica admitted it was most likely accepted a moment ago), then the rest in order."""
        js = self.nc.jetstream()
        state = (await js.stream_info(subjects.RUNS_STREAM)).state
        if not state.messages:
            return
        recent = max(state.first_seq, state.last_seq - QUEUE_RECENT + 1)
        for seq in range(state.last_seq, recent - 1, -1):
            with contextlib.suppress(NotFoundError):  # acked (deleted) already
                yield await js.get_msg(subjects.RUNS_STREAM, seq=seq)
        seq = state.first_seq
        for _ in range(QUEUE_SCAN_LIMIT):
            try:
                msg = await js.get_msg(
                    subjects.RUNS_STREAM, seq=seq, subject=subjects.RUNS_ALL, next=True
                )
            except NotFoundError:
                return
            assert msg.seq is not None
            if msg.seq >= recent:
                return
            seq = msg.seq + 1
            yield msg

    async def on_run_list(self, ctx: h.RunContext, request: RunList) -> RunListed:
        principal = self._principal(ctx)
        records = await self.records.list(principal.tenant, principal.user_id)
        if request.session_id is not None:
            records = [r for r in records if r.session_id == request.session_id]
        if request.parent_run_id is not None:
            records = [r for r in records if r.parent_run_id == request.parent_run_id]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return RunListed(records=records[: request.limit])

    async def on_run_cancel(self, ctx: h.RunContext, request: RunCancel) -> RunInfo:
        """Only the owner's cancel reaches the run: the record is looked up under the caller,
        and the cancel subject carries the owner."""
        principal = self._principal(ctx)
        record = await self.records.get(principal.tenant, principal.user_id, request.run_id)
        if record is None and (queued := await self._queued(principal, request.run_id)):
            return RunInfo(record=await self._cancel_queued(queued))
        if record is None:
            raise NotFound(f"no run {request.run_id!r}")
        if record.status == "queued" and record.error is not None:
            # Waiting in the stream for a retry: no replica holds it to tell. The record says
            # cancelled, and the next delivery ends there.
            record = await self.records.set_status(record, "cancelled")
        elif record.status in ("running", "waiting_approval", "queued", "paused"):
            cancel = subjects.run_cancel(principal.tenant, principal.user_id, request.run_id)
            await self.nc.publish(cancel, b"")
        return RunInfo(record=record)

    async def _cancel_queued(self, queued: RunRecord) -> RunRecord:
        """A run still in the queue, never delivered: no replica holds it to tell. Its record
        says cancelled (every delivery reads it first, queue.py) and its followers read its
        end now, not when a slot frees; the delivery that finds it ends under the same
        `run.failed` id, so the stream keeps one."""
        error = RunCancelled(queued.run_id).to_info()
        record = msgspec.structs.replace(queued, status="cancelled", updated_at=now(), error=error)
        await self.records.put(record)
        owner = {"tenant": record.tenant, "user_id": record.user_id}
        ended = h.RunContext(run_id=record.run_id, session_id=record.session_id, props=owner)
        await RunEvents(self.events, ended).failed(error)
        await self.events.settle(ended)
        # A replica that took the request after the queue was read is told as a running run is.
        await self.nc.publish(
            subjects.run_cancel(record.tenant, record.user_id, record.run_id), b""
        )
        log.info("queued_run_cancelled", run_id=record.run_id)
        return record

    async def on_approval_decide(
        self, ctx: h.RunContext, request: ApprovalDecide
    ) -> ApprovalDecided:
        """A person approves or denies a call their run is waiting on; the first decision wins."""
        principal = self._principal(ctx)
        decision = await self.approvals.decide(
            request.run_id,
            request.call_id,
            principal.tenant,
            principal.user_id,
            request.decision,
            request.note,
        )
        log.info(
            "approval_decided",
            run_id=request.run_id,
            call_id=request.call_id,
            decision=decision,
            approver=principal.user_id,
        )
        return ApprovalDecided(run_id=request.run_id, call_id=request.call_id, decision=decision)

    async def on_client_tool_answer(
        self, ctx: h.RunContext, request: ClientToolAnswer
    ) -> ClientToolAnswered:
        """The caller answers a call of its own tools its run waits on; the first answer wins."""
        principal = self._principal(ctx)
        result = FunctionResultContent(
            call_id=request.call_id, result=request.result, error=request.error
        )
        owner = Owner(principal.tenant, principal.user_id)
        await self.client_calls.answer(request.run_id, request.call_id, owner, result)
        log.info("client_tool_answered", run_id=request.run_id, call_id=request.call_id)
        return ClientToolAnswered(run_id=request.run_id, call_id=request.call_id)

    async def on_run_pause(self, ctx: h.RunContext, request: RunPause) -> RunPending:
        """The caller's run pauses at its next step boundary (`run_control.py`)."""
        return await self.control.pause(self._principal(ctx), request)

    async def on_run_pending(self, ctx: h.RunContext, request: RunPendingGet) -> RunPending:
        return await self.control.pending(self._principal(ctx), request)

    async def on_run_edit(self, ctx: h.RunContext, request: RunEdit) -> RunPending:
        return await self.control.edit(self._principal(ctx), request)

    async def on_run_resume(self, ctx: h.RunContext, request: RunResume) -> RunPending:
        return await self.control.resume(self._principal(ctx), request)

    async def on_run_fork(self, ctx: h.RunContext, request: RunFork) -> RunForked:
        principal = self._principal(ctx)
        return await self.control.fork(principal, self._trusted(principal), request)
