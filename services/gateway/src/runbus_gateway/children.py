"""Child runs over the bus: the request published into the run queue with the parent's own
credential and trace, and the wait for the child's final event — live, and from the events
stream, which keeps it for a parent that comes back after a restart. A cancel of the parent,
heard on its cancel subject while it waits, is passed on to the child."""

import asyncio
import contextlib
from typing import Final

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind

from runbus import headers as h
from runbus import subjects
from runbus.bus import Bus
from runbus.headers import RunContext
from runbus.messages import ErrorInfo, RunCompleted, RunFailed, RunRequest, encode
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus.telemetry import inject, messaging_attributes
from runbus.tokens import run_msg_id

WAIT_SLICE: Final = 5.0
"""Seconds of the child's silence after which its stored events are read (and the parent's
deadline looked at)."""

log = structlog.get_logger()


class ChildRuns:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def call_agent(
        self, ctx: RunContext, request: RunRequest, tool: str, *, first_send: bool
    ) -> RunCompleted | RunFailed:
        tenant, user_id = ctx.prop("tenant"), ctx.prop("user_id")
        child = request.run_id
        with self.bus.tracer.start_as_current_span(
            f"execute_tool {tool}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.agent.name": request.agent,
                "runbus.run_id": ctx.run_id,
                "runbus.child_run_id": child,
            },
        ):

            async def on_parent_cancel(_: Msg) -> None:
                await self._cancel(tenant, user_id, child)

            arrived: asyncio.Queue[bytes] = asyncio.Queue()

            async def on_event(msg: Msg) -> None:
                arrived.put_nowait(msg.data)

            events = subjects.events(tenant, user_id, child)
            # Both listened to before the child is published: nothing it says is missed
            # while the connection holds (the stream is read when it may not have).
            cancels = await self.bus.nc.subscribe(
                subjects.run_cancel(tenant, user_id, ctx.run_id), cb=on_parent_cancel
            )
            live = await self.bus.nc.subscribe(events, cb=on_event)
            try:
                # A call this run never sent cannot have a child yet; a resumed one may.
                last = None if first_send else await self._last_event(events)
                if last is None:
                    await self._publish(ctx, request)
                else:
                    log.info("child_run_found", run_id=ctx.run_id, child_run_id=child)
                    arrived.put_nowait(last)
                return await self._final_event(ctx, events, child, arrived)
            finally:
                for subscription in (live, cancels):
                    with contextlib.suppress(nats.errors.Error):
                        await subscription.unsubscribe()

    async def _publish(self, ctx: RunContext, request: RunRequest) -> None:
        """Into the run queue as the parent's owner, deduped by the child's id and that
        owner's credential (a second delivery of the parent publishing again within the
        window is dropped)."""
        subject = subjects.runs(request.agent)
        data = encode(request)
        with self.bus.tracer.start_as_current_span(
            f"send {subjects.RUNS_TEMPLATE}",
            kind=SpanKind.PRODUCER,
            attributes=messaging_attributes(subject, "send", message_size=len(data)),
        ):
            # The dedupe key names the credential: nobody else's publish of this id first
            # can make the child a dropped duplicate.
            _, _, token = ctx.auth.partition(" ")
            headers = {h.AUTH: ctx.auth, h.MSG_ID: run_msg_id(token.strip(), request.run_id)}
            inject(headers)
            await self.bus.stream_publish(subject, data, headers)
        log.info(
            "child_run_started",
            run_id=ctx.run_id,
            child_run_id=request.run_id,
            agent=request.agent,
            depth=request.depth,
        )

    async def _last_event(self, events: str) -> bytes | None:
        """The last event the child stored, if any."""
        try:
            msg = await self.bus.js.get_last_msg(subjects.EVENTS_STREAM, events)
        except nats.js.errors.NotFoundError:
            return None
        return msg.data

    async def _final_event(
        self, ctx: RunContext, events: str, child: str, arrived: asyncio.Queue[bytes]
    ) -> RunCompleted | RunFailed:
        """The child's `run.completed` or `run.failed`, as it publishes it; when it has said
        nothing for a while, its last stored event is read (the live one may have been lost
        with a reconnect). At the parent's deadline the child is cancelled."""
        while True:
            left = ctx.time_left()
            if left is not None and left <= 0:
                await self._cancel(ctx.prop("tenant"), ctx.prop("user_id"), child)
                return RunFailed(
                    run_id=child,
                    error=ErrorInfo(
                        code="deadline_exceeded",
                        message="the calling run's deadline passed before the agent answered",
                    ),
                )
            data: bytes | None
            try:
                async with asyncio.timeout(WAIT_SLICE if left is None else min(left, WAIT_SLICE)):
                    data = await arrived.get()
            except TimeoutError:
                data = await self._last_event(events)
            if data is None:
                continue
            try:
                event = RUN_EVENT_DECODER.decode(data)
            except msgspec.DecodeError:
                continue  # an event of a newer producer: not the final one this version knows
            if isinstance(event, RunCompleted | RunFailed) and event.run_id == child:
                return event

    async def _cancel(self, tenant: str, user_id: str, child: str) -> None:
        log.info("child_run_cancelling", child_run_id=child)
        with contextlib.suppress(nats.errors.Error):
            await self.bus.nc.publish(subjects.run_cancel(tenant, user_id, child), b"")
