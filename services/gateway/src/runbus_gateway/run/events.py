"""A run's event protocol, emitted from one place: every event a run publishes, in the order
a follower reads them, each with the stable id that makes a resumed run's repeat a no-op."""

from collections.abc import Collection
from typing import Final, Protocol

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolProgress,
    RunToolResult,
)
from runbus.messages.compaction import CompactionReport
from runbus.messages.errors import ErrorInfo
from runbus.messages.tools import ApprovalRequest

FINAL: Final = "final"
"""The event id of a run's final event (`Nats-Msg-Id` = `<owner's run>:final`)."""


class EventPort(Protocol):
    async def emit(self, ctx: RunContext, event: RunEvent, *, event_id: str) -> None: ...

    async def settle(self, ctx: RunContext) -> Collection[str]:
        """Wait until every event of the run emitted so far is stored; the ids (`event_id`)
        of those the stream already held."""
        ...


class RunEvents:
    """The events of one run (`ctx`), through `port`."""

    def __init__(self, port: EventPort, ctx: RunContext) -> None:
        self.port = port
        self.ctx = ctx

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    async def started(self, agent: str) -> None:
        event = RunStarted(run_id=self.run_id, session_id=self.ctx.session_id, agent=agent)
        await self.port.emit(self.ctx, event, event_id="started")

    async def text(self, message_id: str, delta: str, *, event_id: str) -> None:
        """Text the gateway itself adds (a refusal, a rewrite, a program's reply); the
        model's own deltas stream from the model router."""
        event = RunTextDelta(run_id=self.run_id, message_id=message_id, delta=delta)
        await self.port.emit(self.ctx, event, event_id=event_id)

    async def compacted(self, step: int, report: CompactionReport) -> None:
        event = RunCompacted(run_id=self.run_id, step=step, report=report)
        await self.port.emit(self.ctx, event, event_id=f"compacted-{step}")

    async def tool_calls(
        self,
        calls: list[FunctionCallContent],
        client: set[str] | None = None,
        checkpoint: list[ChatMessage] | None = None,
    ) -> bool:
        """`client`: ids of the calls that go to the client (`RunToolCall.client`).
        `checkpoint`: what the run produced since its last checkpoint (`Checkpointer`); the
        first call's event carries it, and when there is any, this returns once the events
        stream has stored them all — the step's calls may run then. False when the stream
        already held an event under the first call's id (a model that repeats a call id of
        an earlier step): that stored copy is not this checkpoint, the caller saves it another
        way."""
        client = client or set()
        for index, call in enumerate(calls):
            event = RunToolCall(
                run_id=self.run_id,
                call=call,
                client=call.call_id in client,
                client_calls=len(client),
                checkpoint=(checkpoint or []) if index == 0 else [],
            )
            await self.port.emit(self.ctx, event, event_id=f"call-{call.call_id}")
        if not checkpoint:
            return True
        held = await self.port.settle(self.ctx)
        return f"call-{calls[0].call_id}" not in held

    async def tool_results(self, results: list[FunctionResultContent]) -> None:
        for result in results:
            event = RunToolResult(run_id=self.run_id, result=result)
            await self.port.emit(self.ctx, event, event_id=f"result-{result.call_id}")

    async def tool_progress(
        self, call_id: str, tool: str, state: str, text: str, *, number: int
    ) -> None:
        """The `number`th progress report of a call still working (a delivery that follows
        the same call again repeats the same ids, stored once)."""
        event = RunToolProgress(
            run_id=self.run_id, call_id=call_id, tool=tool, state=state, text=text
        )
        await self.port.emit(self.ctx, event, event_id=f"progress-{call_id}-{number}")

    async def approval_requested(self, call_id: str, request: ApprovalRequest) -> None:
        event = RunApprovalRequested(
            run_id=self.run_id,
            call_id=call_id,
            tool=request.tool,
            arguments=request.arguments,
            reason=request.reason,
            expires_at=request.expires_at,
            question=request.question,
        )
        await self.port.emit(self.ctx, event, event_id=f"approval-{call_id}")

    # A run's final event, completed or failed, has one id: of two attempts alive at once (a
    # partition, a pause) the stream keeps the first to end the run, and tells the other it
    # was a duplicate. It is published once every earlier event is stored: one whose ack was
    # lost (a node restarting) is published again by `settle`, and must not land after it.
    # By then a run's earlier acks have long arrived, so this costs no round trip.
    async def completed(self, completed: RunCompleted) -> None:
        await self.port.settle(self.ctx)
        await self.port.emit(self.ctx, completed, event_id=FINAL)

    async def failed(self, error: ErrorInfo) -> None:
        event = RunFailed(run_id=self.run_id, error=error)
        await self.port.settle(self.ctx)
        await self.port.emit(self.ctx, event, event_id=FINAL)
