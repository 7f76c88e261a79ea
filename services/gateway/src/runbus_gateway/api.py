"""The authenticated client API (`runbus.api.*`): runs and approvals answered here, everything
else forwarded to the owning service with the caller's identity as trusted headers."""

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS

from runbus import headers as h
from runbus import ops, subjects
from runbus.bus import Bus
from runbus.errors import NotFound
from runbus.messages.runs import (
    AgentList,
    AgentListed,
    AgentSummary,
    ApprovalDecide,
    ApprovalDecided,
    RunCancel,
    RunGet,
    RunInfo,
    RunList,
    RunListed,
)
from runbus.service import RAW_DECODER, Endpoint

from .agents import AgentSpec
from .approvals import Approvals
from .auth import Principal, TokenVerifier
from .runs import RunRecords

log = structlog.get_logger()


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

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint.for_op(ops.API_RUNS_GET, self.on_run_get),
            Endpoint.for_op(ops.API_RUNS_LIST, self.on_run_list),
            Endpoint.for_op(ops.API_RUNS_CANCEL, self.on_run_cancel),
            Endpoint.for_op(ops.API_APPROVALS_DECIDE, self.on_approval_decide),
            Endpoint.for_op(ops.API_AGENTS_LIST, self.on_agent_list),
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
                AgentSummary(name=name, description=agent.description)
                for name, agent in sorted(self.agents.items())
            ]
        )

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
        """Only the owner's cancel reaches the run: the record is looked up under the caller,
        and the cancel subject carries the owner."""
        principal = self._principal(ctx)
        record = await self.records.get(principal.tenant, principal.user_id, request.run_id)
        if record is None:
            raise NotFound(f"no run {request.run_id!r}")
        if record.status == "queued" and record.error is not None:
            # Waiting in the stream for a retry: no replica holds it to tell. The record says
            # cancelled, and the next delivery ends there.
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
