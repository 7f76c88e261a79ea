"""The client SDK: publish a run request on the bus and follow its events.

What it sends is exactly the JSON of DESIGN §5 with `rb-auth` and `Nats-Msg-Id`, so any NATS
client can do the same by hand.
"""

import uuid
from collections.abc import AsyncIterator

import nats.errors
from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from . import headers as h
from . import subjects
from .errors import RemoteError, Unavailable
from .messages import (
    ChatMessage,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunRequest,
    TextContent,
    encode,
)
from .messages.runs import RUN_EVENT_DECODER
from .telemetry import inject, messaging_attributes


class RunFailedError(RemoteError):
    """The run ended with `run.failed`."""

    def __init__(self, event: RunFailed) -> None:
        super().__init__(event.error.code, event.error.message, details=event.error.details)
        self.event = event


def new_run_id() -> str:
    return f"r-{uuid.uuid4().hex[:16]}"


class RunbusClient:
    def __init__(self, nc: NATS, *, token: str) -> None:
        self.nc = nc
        self.token = token
        self.tracer = trace.get_tracer("runbus.client")

    async def run(
        self,
        agent: str,
        session_id: str,
        message: str | list[ChatMessage],
        *,
        run_id: str | None = None,
        timeout: float = 300.0,
    ) -> AsyncIterator[RunEvent]:
        """Start a run and yield its events until `run.completed` or `run.failed`."""
        run_id = run_id or new_run_id()
        messages = (
            [ChatMessage(role="user", contents=[TextContent(text=message)])]
            if isinstance(message, str)
            else message
        )
        request = RunRequest(run_id=run_id, agent=agent, session_id=session_id, input=messages)
        # Subscribe before publishing so no event can be missed.
        subscription = await self.nc.subscribe(subjects.events(run_id))
        try:
            data = encode(request)
            subject = subjects.runs(agent)
            with self.tracer.start_as_current_span(
                f"send {subjects.RUNS_TEMPLATE}",
                kind=SpanKind.PRODUCER,
                attributes=messaging_attributes(subject, "send", message_size=len(data)),
            ):
                headers = {h.AUTH: f"Bearer {self.token}", h.MSG_ID: run_id}
                inject(headers)
                try:
                    await self.nc.jetstream().publish(subject, data, headers=headers)
                except nats.errors.NoRespondersError:
                    raise Unavailable(
                        "no run queue on this NATS: is the gateway running (`runbus up`)?"
                    ) from None
            while True:
                try:
                    msg = await subscription.next_msg(timeout=timeout)
                except nats.errors.TimeoutError:
                    raise Unavailable(f"no event from run {run_id} for {timeout:.0f}s") from None
                event = RUN_EVENT_DECODER.decode(msg.data)
                yield event
                if isinstance(event, RunCompleted | RunFailed):
                    return
        finally:
            await subscription.unsubscribe()

    async def run_to_completion(
        self, agent: str, session_id: str, message: str | list[ChatMessage], **kwargs: object
    ) -> RunCompleted:
        """Run and return the final event; raise `RunFailedError` on `run.failed`."""
        async for event in self.run(agent, session_id, message, **kwargs):  # type: ignore[arg-type]
            if isinstance(event, RunCompleted):
                return event
            if isinstance(event, RunFailed):
                raise RunFailedError(event)
        raise Unavailable("the event stream ended without a final event")
