"""One tool call from request to reply, without NATS: visibility, validation, the middleware
chain, approval, at-most-once runs of side-effecting tools, timeouts and cancellation."""

import asyncio
import inspect
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, assert_never

import msgspec
import structlog
from opentelemetry import trace
from opentelemetry.trace import Tracer

from runbus.cancels import RunCancels
from runbus.headers import RunContext
from runbus.interrupts import Answer, Interrupt, answering
from runbus.messages import FunctionResultContent
from runbus.messages.tools import ApprovalRequest, ToolInvoke, ToolInvoked
from runbus.owners import Owner

from .calls import CallRecord, CallStore, call_key
from .errors import InvalidArguments
from .middleware import (
    DEFAULT_APPROVAL_TTL,
    Call,
    Middleware,
    Modify,
    Proceed,
    Reject,
    RequireApproval,
    Terminate,
    Verdict,
    approval_digest,
)
from .registry import Parsed, Tool

log = structlog.get_logger()

REPLY_MARGIN: Final = 0.1
"""Seconds kept back from the run's deadline to record the result and reply."""
LEASE_GRACE: Final = 2.0
"""Seconds past a call's timeout before its `started` record counts as abandoned."""
POLL_FIRST, POLL_MAX = 0.02, 0.5
"""Seconds between looks at a call another replica is running."""


def _error(call_id: str, text: str) -> ToolInvoked:
    return ToolInvoked(result=FunctionResultContent(call_id=call_id, error=text))


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


class Executor:
    """Runs the calls of one tool_executor replica: its chain, its call store, its root."""

    def __init__(
        self,
        *,
        middleware: Sequence[Middleware] = (),
        calls: CallStore | None = None,
        root: Path | None = None,
        approval_ttl: float = DEFAULT_APPROVAL_TTL,
        max_timeout: float | None = None,
        replica: str = "",
        tracer: Tracer | None = None,
    ) -> None:
        self.middleware = list(middleware)
        self.calls = calls
        """Set before the first side-effecting call (the service opens the KV bucket)."""
        self.root = root
        self.approval_ttl = approval_ttl
        self.max_timeout = max_timeout
        self.replica = replica
        self.tracer = tracer or trace.get_tracer(__name__)
        self.cancels: RunCancels[asyncio.Task[FunctionResultContent]] = RunCancels()
        self._finishing: set[asyncio.Future[FunctionResultContent]] = set()

    def cancel_run(self, owner: Owner, run_id: str) -> int:
        """Stop every call of the owner's `run_id` running here; each replies that the run was
        cancelled. Another owner's run of the same id is not touched."""
        cancelled = self.cancels.cancel(owner, run_id)
        if cancelled:
            log.info("tool_calls_cancelled", run_id=run_id, calls=cancelled)
        return cancelled

    async def invoke(self, tool: Tool, request: ToolInvoke, ctx: RunContext) -> ToolInvoked:
        with self.tracer.start_as_current_span(
            f"execute_tool {tool.name}",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool.name,
                "gen_ai.tool.call.id": request.call_id,
                "runbus.tool.side_effect": tool.side_effect,
            },
        ) as span:
            reply = await self._invoke(tool, request, ctx)
            span.set_attribute("runbus.tool.outcome", reply.outcome)
            if reply.replayed:
                span.set_attribute("runbus.tool.replayed", True)
            attributes = getattr(span, "attributes", None) or {}
            if reply.result.error is not None and "error.type" not in attributes:
                span.set_attribute("error.type", "tool_error")
            return reply

    async def _invoke(self, tool: Tool, request: ToolInvoke, ctx: RunContext) -> ToolInvoked:
        call_id = request.call_id
        if not tool.visible_to(ctx):
            log.info("tool_call_not_visible", tool=tool.name, agent=ctx.agent)
            return _error(call_id, f"no tool named {tool.name!r} is available to this run")
        key, stale = None, None
        if tool.side_effect:
            if not ctx.run_id:
                return _error(call_id, f"tool {tool.name!r} changes things and runs only in a run")
            key = call_key(Owner.of(ctx), ctx.run_id, call_id)
            # A repeat is answered from its record before any check runs again; a first send
            # has none to find, and its claim in `_once` would find one anyway.
            found = None if request.first_send else await self._store.get(key)
            if found is not None:
                settled = await self._settle(tool, key, found, call_id, ctx)
                if isinstance(settled, ToolInvoked):
                    return settled
                stale = settled
        try:
            parsed = tool.parse(tool.without_injected(request.arguments), self.root)
        except InvalidArguments as exc:
            log.info("tool_call_invalid", tool=tool.name, reason=exc.message)
            return _error(call_id, exc.message)
        call = Call(
            tool=tool.name,
            call_id=call_id,
            arguments=parsed.arguments,
            run=ctx,
            side_effect=tool.side_effect,
        )
        verdict, parsed = await self._decide(tool, parsed, call)
        match verdict.stop:
            case Reject(error=error, result=result):
                log.info("tool_call_rejected", tool=tool.name, reason=error)
                return ToolInvoked(
                    result=FunctionResultContent(call_id=call_id, result=result, error=error)
                )
            case Terminate(error=error, result=result):
                log.info("tool_loop_terminated", tool=tool.name, reason=error)
                return ToolInvoked(
                    result=FunctionResultContent(call_id=call_id, result=result, error=error),
                    outcome="terminate",
                )
            case None:
                pass
            case _:
                assert_never(verdict.stop)
        approved_by = ""
        if verdict.approvals:
            answer = self._approval(tool, request, ctx, parsed, verdict)
            if isinstance(answer, ToolInvoked):
                return answer
            approved_by = answer
        if key is None:
            return await self._asking(tool, request, parsed, ctx, approved_by)
        return await self._once(tool, key, stale, parsed, ctx, call_id, approved_by)

    async def _asking(
        self, tool: Tool, request: ToolInvoke, parsed: Parsed, ctx: RunContext, approved_by: str
    ) -> ToolInvoked:
        """Run a call that may ask the run's owner a question (`runbus.interrupts`): asked,
        it is an approval request with the question as its reason; sent again with the
        owner's grant for that question, the tool finds the note as the answer."""
        call_id = request.call_id
        grant = request.approval

        def digest(question: str) -> str:
            asked = {"question": question, "arguments": dict(parsed.arguments)}
            return approval_digest(ctx.run_id, call_id, tool.name, asked)

        def answers(question: str) -> Answer:
            if grant is None or grant.digest != digest(question):
                return None
            if grant.decision == "approved":
                return ("answered", grant.note)
            return ("declined", grant.decision)

        try:
            with answering(answers):
                result = await self._run(
                    tool, parsed, ctx, call_id, approved_by, self._timeout(tool, ctx)
                )
        except Interrupt as asked:
            if grant is not None:
                # A call carries one grant: an answer to a first question, or an approval;
                # asking after either would loop between them.
                log.warning("tool_asked_again", tool=tool.name)
                return _error(
                    call_id,
                    f"tool {tool.name!r} asks at most one question per call, and none after an"
                    " approval",
                )
            log.info("tool_asked", tool=tool.name)
            expires_at = time.time() + self.approval_ttl
            return ToolInvoked(
                result=FunctionResultContent(
                    call_id=call_id,
                    error=f"not finished: the tool asks the user {asked.question!r} first",
                ),
                outcome="approval_required",
                approval=ApprovalRequest(
                    tool=tool.name,
                    arguments=dict(parsed.arguments),
                    reason=asked.question,
                    expires_at=round(expires_at, 3),
                    digest=digest(asked.question),
                    question=True,
                ),
            )
        return ToolInvoked(result=result)

    async def _decide(self, tool: Tool, parsed: Parsed, call: Call) -> tuple[Verdict, Parsed]:
        """Run the chain: the first refusal wins; approvals are collected on the way."""
        verdict = Verdict()
        for middleware in self.middleware:
            try:
                # Typed as anything: deployment code may return what it should not.
                decision: object = middleware(call)
                if inspect.isawaitable(decision):
                    decision = await decision
            except Exception:
                log.exception(
                    "tool_middleware_failed", tool=tool.name, middleware=_name(middleware)
                )
                verdict.stop = Reject(error="not run: a policy check failed; try again later")
                return verdict, parsed
            match decision:
                case Proceed():
                    pass
                case Modify(arguments=arguments):
                    try:
                        parsed = tool.parse(tool.without_injected(arguments), self.root)
                    except InvalidArguments as exc:
                        log.error(
                            "tool_middleware_invalid_change", tool=tool.name, reason=exc.message
                        )
                        verdict.stop = Reject(
                            error=f"not run: a policy made the call invalid: {exc}"
                        )
                        return verdict, parsed
                    log.info("tool_arguments_modified", tool=tool.name, by=_name(middleware))
                    call = replace(call, arguments=parsed.arguments)
                case RequireApproval():
                    verdict.approvals.append(decision)
                case Reject() | Terminate():
                    verdict.stop = decision
                    return verdict, parsed
                case _:
                    log.error("tool_middleware_bad_decision", middleware=_name(middleware))
                    verdict.stop = Reject(error="not run: a policy check failed; try again later")
                    return verdict, parsed
        try:
            reason = tool.approval_reason(parsed.arguments)
        except Exception:
            log.exception("tool_approval_rule_failed", tool=tool.name)
            verdict.stop = Reject(error="not run: the approval rule failed; try again later")
            return verdict, parsed
        if reason:
            verdict.approvals.append(RequireApproval(reason=reason))
        return verdict, parsed

    def _approval(
        self, tool: Tool, request: ToolInvoke, ctx: RunContext, parsed: Parsed, verdict: Verdict
    ) -> ToolInvoked | str:
        """The approver's user id when a valid approval came with the call, else the reply."""
        call_id = request.call_id
        digest = approval_digest(ctx.run_id, call_id, tool.name, parsed.arguments)
        grant = request.approval
        reason = verdict.approval_reason
        if grant is not None and grant.decision == "denied":
            log.info("tool_approval_denied", tool=tool.name, approver=grant.approver)
            note = f" ({grant.note})" if grant.note else ""
            who = grant.approver or "the approver"
            return _error(call_id, f"not run: {who} denied approval{note}. Do not retry it.")
        if grant is not None and grant.decision == "expired":
            log.info("tool_approval_expired", tool=tool.name)
            return _error(
                call_id,
                f"not run: it needed approval ({reason}) and nobody decided in time. "
                "Tell the user; do not retry it unless they ask.",
            )
        if grant is not None and grant.digest == digest:
            log.info("tool_call_approved", tool=tool.name, approver=grant.approver)
            return grant.approver or "unknown"
        if grant is not None:
            log.warning("tool_approval_mismatch", tool=tool.name)
        expires_at = time.time() + verdict.approval_ttl(self.approval_ttl)
        log.info("tool_approval_required", tool=tool.name, reason=reason)
        return ToolInvoked(
            result=FunctionResultContent(
                call_id=call_id,
                error=f"not run: this call needs a person's approval ({reason}) first",
            ),
            outcome="approval_required",
            approval=ApprovalRequest(
                tool=tool.name,
                arguments=dict(parsed.arguments),
                reason=reason,
                expires_at=round(expires_at, 3),
                digest=digest,
            ),
        )

    async def _once(
        self,
        tool: Tool,
        key: str,
        stale: int | None,
        parsed: Parsed,
        ctx: RunContext,
        call_id: str,
        approved_by: str,
    ) -> ToolInvoked:
        """Run a side-effecting call at most once: record `started`, run, record `done`."""
        store = self._store
        timeout = self._timeout(tool, ctx)
        now = time.time()
        record = CallRecord(
            state="started",
            tool=tool.name,
            started_at=now,
            lease_until=now + max(timeout, 0) + LEASE_GRACE,
            replica=self.replica,
        )
        claimed = await (
            store.claim(key, record) if stale is None else store.take_over(key, record, stale)
        )
        if not claimed:
            found = await store.get(key)
            settled = (
                await self._settle(tool, key, found, call_id, ctx) if found is not None else None
            )
            if isinstance(settled, ToolInvoked):
                return settled
            # An idempotent tool's abandoned record, met only here by a first send, is taken
            # over as the lookup would have; one already taken over is not taken again.
            if settled is None or stale is not None:
                return _error(call_id, _unknown(tool, now))
            if not await store.take_over(key, record, settled):
                return _error(call_id, _unknown(tool, now))
            stale = settled
        if stale is not None:
            log.warning("tool_call_rerun", tool=tool.name, key=key)

        async def run_and_record() -> FunctionResultContent:
            result = await self._run(tool, parsed, ctx, call_id, approved_by, timeout)
            try:
                await store.finish(
                    key, msgspec.structs.replace(record, state="done", result=result)
                )
            except Exception:
                # The call ran; a retry will find it `started` and report the outcome as
                # unknown rather than run it again.
                log.exception("tool_call_record_failed", tool=tool.name, key=key)
            return result

        # Once started, a side-effecting call runs to its end and records its result even
        # when its caller stops listening (a gateway that died, a reply NATS lost): the run,
        # resumed or sending the call again, then gets that result instead of an outcome
        # nobody knows. Only cancelling the run (`cancel_run`) cuts it short.
        work = asyncio.ensure_future(run_and_record())
        self._finishing.add(work)
        work.add_done_callback(self._finishing.discard)
        return ToolInvoked(result=await asyncio.shield(work))

    async def finish_started(self) -> None:
        """Wait for the side-effecting calls still running after their callers left, so a
        replica that stops records their results before it closes its connection."""
        if self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)

    async def _settle(
        self,
        tool: Tool,
        key: str,
        found: tuple[CallRecord, int],
        call_id: str,
        ctx: RunContext,
    ) -> ToolInvoked | int:
        """The answer for a call that has a record already: its recorded result, after waiting
        for a live run elsewhere; for an abandoned one, "unknown" — or its revision when the
        tool is declared idempotent and may run again."""
        record, revision = found
        poll = POLL_FIRST
        while record.state == "started" and time.time() < record.lease_until:
            left = ctx.time_left()
            if left is not None and left <= REPLY_MARGIN + poll:
                return _error(call_id, f"tool {tool.name!r} is still running this call elsewhere")
            await asyncio.sleep(poll)
            poll = min(poll * 2, POLL_MAX)
            again = await self._store.get(key)
            if again is None:
                return _error(call_id, _unknown(tool, record.started_at))
            record, revision = again
        if record.state == "done" and record.result is not None:
            log.info("tool_call_replayed", tool=tool.name, key=key, ran_on=record.replica)
            return ToolInvoked(result=record.result, replayed=True)
        if tool.idempotent:
            return revision
        log.warning("tool_outcome_unknown", tool=tool.name, key=key, ran_on=record.replica)
        return _error(call_id, _unknown(tool, record.started_at))

    async def _run(
        self,
        tool: Tool,
        parsed: Parsed,
        ctx: RunContext,
        call_id: str,
        approved_by: str,
        timeout: float,
    ) -> FunctionResultContent:
        if timeout <= 0:
            return FunctionResultContent(
                call_id=call_id, error="not run: the run's deadline leaves no time for it"
            )
        task = asyncio.ensure_future(
            tool.run(
                parsed,
                ctx,
                call_id=call_id,
                timeout=timeout,
                approved_by=approved_by,
            )
        )
        try:
            with self.cancels.holding(Owner.of(ctx), ctx.run_id, task):
                return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or current.cancelling() == 0):
                maybe = " It may or may not have taken effect." if tool.side_effect else ""
                return FunctionResultContent(
                    call_id=call_id, error=f"not finished: the run was cancelled.{maybe}"
                )
            raise

    def _timeout(self, tool: Tool, ctx: RunContext) -> float:
        """The tool's timeout, capped by the time the run has left and, for a caller that does
        not listen for heartbeats, by the hop timeout."""
        limit = tool.timeout
        if self.max_timeout is not None and not ctx.progress:
            limit = min(limit, self.max_timeout)
        left = ctx.time_left()
        if left is not None:
            limit = min(limit, left - REPLY_MARGIN)
        return limit

    @property
    def _store(self) -> CallStore:
        if self.calls is None:
            raise RuntimeError("the executor has no call store; start the service first")
        return self.calls


def _unknown(tool: Tool, started_at: float) -> str:
    return (
        f"outcome unknown: an executor started this {tool.name!r} call at {_when(started_at)} "
        "and stopped before it finished, so it may or may not have taken effect. Check "
        "before trying again: a new call would run again."
    )


def _name(middleware: Middleware) -> str:
    return getattr(middleware, "__qualname__", type(middleware).__qualname__)
