"""What a delivery of a run request ends as: completed, retried with backoff, failed, or moved
to the dead letters — each with its record, its final event and its log line."""

import contextlib
from typing import Final

import structlog

from runbus import headers as h
from runbus import subjects
from runbus.bus import Bus
from runbus.consumer import Delivery, backoff
from runbus.errors import RunbusError
from runbus.failures import as_runbus_error, handle_failure
from runbus.messages import ErrorInfo, RunCompleted, RunFailed, is_identifier
from runbus.messages.runs import RUN_EVENT_DECODER, RunRecord, RunStatus
from runbus.owners import Owner
from runbus.tokens import Principal

from .agents import AgentSpec
from .errors import DeadLettered, RunCancelled
from .harness.user_errors import user_error
from .pauses import Pauses
from .ports import BusPorts
from .run.events import FINAL, RunEvents
from .run.pause import Superseded, check_current
from .runs import DEAD_LETTERED, RETRYABLE, RunRecords

RETRY_WINDOW: Final = 30.0
"""Seconds of backoff a run failing `unavailable` is retried over (`run_retry_window`)."""


def attempts_within(window: float) -> int:
    """Deliveries that may run when retries back off over `window` seconds (0.5 s, 1 s, 2 s,
    … apart): the fewest whose backoffs add up to it. One more delivery only moves the
    request to the dead letters."""
    attempts, waited = 1, 0.0
    while waited < window:
        waited += backoff(attempts)
        attempts += 1
    return attempts


log = structlog.get_logger()


class EndedEarlier(Exception):
    """A delivery of a run an earlier delivery recorded as completed or failed."""

    def __init__(self, record: RunRecord) -> None:
        super().__init__(f"run {record.run_id!r} ended earlier ({record.status})")
        self.record = record


class RunBook:
    def __init__(
        self,
        bus: Bus,
        ports: BusPorts,
        records: RunRecords,
        agents: dict[str, AgentSpec],
        *,
        retry_window: float = RETRY_WINDOW,
    ) -> None:
        self.max_attempts = attempts_within(retry_window)
        """Deliveries that may run (`attempts_within`)."""
        self.bus = bus
        self.ports = ports
        self.records = records
        self.agents = agents
        self.pauses = Pauses(ports.approvals.bucket.kv)
        """Where each delivery after the first fences the earlier ones (`Pauses.fence`)."""

    async def completed(self, ctx: h.RunContext, record: RunRecord, done: RunCompleted) -> None:
        """The final event, then the record; both stored before the request is acked. When
        another attempt of the run ended it first, the record tells that end instead."""
        await RunEvents(self.ports, ctx).completed(done)
        ended = await self._ended_elsewhere(ctx)
        if ended is not None:
            await self._record_end(record, ended)
            return
        await self.records.set_status(record, "completed", text=done.text, output=done.output)

    async def _ended_elsewhere(self, ctx: h.RunContext) -> RunCompleted | RunFailed | None:
        """Settle the run's events; the final event another attempt stored first, if any (the
        stream answered this attempt's as a duplicate)."""
        duplicates = await self.ports.events.settle(ctx)
        seq = duplicates.get(f"{Owner.of(ctx).key(ctx.run_id)}:{FINAL}")
        if seq is None:
            return None
        stored = await self.bus.js.get_msg(subjects.EVENTS_STREAM, seq, direct=True)
        event = RUN_EVENT_DECODER.decode(stored.data or b"")
        log.warning("run_ended_elsewhere", run_id=ctx.run_id, type=type(event).__name__)
        return event if isinstance(event, RunCompleted | RunFailed) else None

    async def _record_end(self, record: RunRecord, ended: RunCompleted | RunFailed) -> None:
        match ended:
            case RunCompleted(text=text, output=output):
                await self.records.set_status(record, "completed", text=text, output=output)
            case RunFailed(error=error):
                status: RunStatus = "cancelled" if error.code == "cancelled" else "failed"
                await self.records.set_status(record, status, error=error)

    async def failed(
        self,
        delivery: Delivery,
        agent: str,
        run_id: str,
        principal: Principal | None,
        record: RunRecord | None,
        exc: Exception,
    ) -> None:
        """Retry a retryable failure with backoff while attempts remain; otherwise tell the
        run's owner with `run.failed`, dead-letter what kept failing, then record it. `agent` is
        the one the request was published for."""
        if isinstance(exc, EndedEarlier):
            info = exc.record.error
            if exc.record.status == "completed" or info is None:
                return  # its final event was stored before its record: the consumer acks
            # Recorded failed by an earlier delivery whose final event may not be stored:
            # only the rest of the ending is done again, never the run.
            dead = info.code in DEAD_LETTERED
            await self._end(
                delivery,
                agent,
                run_id,
                principal,
                exc.record,
                info,
                dead,
                info.message,
                redone=True,
            )
            return
        if isinstance(exc, Superseded) or await self._superseded(delivery, run_id, principal):
            # Another delivery runs it now: this one neither retries nor ends it.
            log.info("run_superseded", run_id=run_id, attempt=delivery.attempt, error=repr(exc))
            delivery.leave()
            return
        retry = as_runbus_error(exc).to_info().code in RETRYABLE
        retry = retry and delivery.attempt < self.max_attempts
        error = handle_failure(
            exc,
            log,
            "run_retrying" if retry else "run_failed",
            level="warning" if retry else "info",
            run_id=run_id,
            attempt=delivery.attempt,
        )
        code = error.to_info().code
        if retry:
            if record is not None:
                shown = self._shown(agent, error)
                with contextlib.suppress(Exception):
                    await self.records.set_status(record, "queued", error=shown)
            await delivery.retry(backoff(delivery.attempt))
            return
        # The log and the dead letter keep the real message; the user reads the agent's.
        info = self._shown(agent, error)
        if record is not None:
            status: RunStatus = "cancelled" if isinstance(error, RunCancelled) else "failed"
            with contextlib.suppress(Exception):
                record = await self.records.set_status(record, status, error=info)
        dead = code in DEAD_LETTERED or isinstance(error, DeadLettered)
        await self._end(delivery, agent, run_id, principal, record, info, dead, error.message)

    async def _superseded(
        self, delivery: Delivery, run_id: str, principal: Principal | None
    ) -> bool:
        """Whether a later delivery of the run has started (read once, on a failure only): an
        earlier one's retry would run it twice at once, and its ending would end a run that
        goes on. Unknown (the read failed) counts as not."""
        if principal is None or not is_identifier(run_id):
            return False
        try:
            found = await self.pauses.get(Owner(principal.tenant, principal.user_id), run_id)
            check_current(found, run_id, delivery.attempt)
        except Superseded:
            return True
        except Exception:
            return False
        return False

    async def _end(
        self,
        delivery: Delivery,
        agent: str,
        run_id: str,
        principal: Principal | None,
        record: RunRecord | None,
        info: ErrorInfo,
        dead: bool,
        message: str,
        *,
        redone: bool = False,
    ) -> None:
        """The session released, the final event stored, then the dead letter: until all
        are, the request is delivered again with backoff, never acked nor dropped (the
        consumer has no max_deliver), so a run acknowledged to its owner always ends in a
        final event and never leaves its session claimed. What the run held is let go first:
        whoever reads the final event finds it free. `redone`:
        this run's own final event may be stored already (a duplicate is no news)."""
        try:
            if record is not None:
                await self._let_go(record, cancelled=info.code == "cancelled")
            if is_identifier(run_id):
                owner = (
                    {"tenant": principal.tenant, "user_id": principal.user_id} if principal else {}
                )
                ctx = h.RunContext(run_id=run_id, props=owner)
                await RunEvents(self.ports, ctx).failed(info)
                ended = await self._ended_elsewhere(ctx)
                if ended is not None and not redone:
                    # Another attempt ended it (and dead-lettered it if need be): that end is
                    # the run's, not this failure.
                    if record is not None:
                        await self._record_end(record, ended)
                    return
            else:
                # Not a subject-safe id: there is no events subject a client could be reading.
                log.info("run_failure_not_published", reason="no usable run id")
            if dead:
                await self._dead_letter(delivery, agent, info.code, message)
        except Exception as exc:
            log.warning(
                "run_failure_not_stored", run_id=run_id, attempt=delivery.attempt, error=repr(exc)
            )
            await delivery.retry(backoff(delivery.attempt))

    async def _let_go(self, record: RunRecord, *, cancelled: bool) -> None:
        """Approvals and client calls withdrawn, and the session's claim released: an earlier
        attempt, cut off, may have taken it."""
        run_id = record.run_id
        with contextlib.suppress(Exception):
            await self.ports.approvals.withdraw(record.tenant, record.user_id, run_id)
        with contextlib.suppress(Exception):
            await self.ports.client_calls.withdraw(Owner(record.tenant, record.user_id), run_id)
        if not record.session_id:
            return
        session = h.RunContext(
            run_id=run_id,
            session_id=record.session_id,
            props={"tenant": record.tenant, "user_id": record.user_id},
        )
        # Failed for good: what it stored (its input first) stays for audit and export, but no
        # later run's prompt loads it (history leaves it out). The claim is released only if
        # this run still holds it. History out of reach (a fault): the ending is tried again
        # later, so the session is never left claimed; any other refusal (no such session)
        # leaves nothing to release.
        try:
            await self.ports.append_history(session, [], release=True, abandon=not cancelled)
        except Exception as exc:
            if as_runbus_error(exc).to_info().code in RETRYABLE:
                raise

    def _shown(self, agent: str, error: RunbusError) -> ErrorInfo:
        """The error as the run's owner reads it (event, run record): the agent's
        `[harness] errors` table, and never an internal message (`user_error`)."""
        spec = self.agents.get(agent)
        return spec.runtime.user_error(error) if spec is not None else user_error(error)

    async def _dead_letter(self, delivery: Delivery, agent: str, code: str, message: str) -> None:
        msg = delivery.msg
        headers = delivery.headers
        headers.pop(h.MSG_ID, None)
        headers.pop(h.AUTH, None)  # a credential does not belong in a long-kept stream
        headers.update({h.ERROR: code, "rb-error-message": message[:1024]})
        target = subjects.dead(agent if is_identifier(agent) else "unknown")
        await self.bus.stream_publish(target, msg.data, headers)
