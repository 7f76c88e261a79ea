"""Everything a run does outside itself, as one protocol: the bus adapters
(`runbus_gateway.ports`) and the unit tests' fakes both implement it."""

from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    MemoryHit,
    ModelResponse,
    ModelSettings,
    OutputFormat,
    RunEvent,
    ToolSpec,
)
from runbus.messages.compaction import CompactResult
from runbus.messages.history import HistoryCompaction
from runbus.messages.sessions import ConcurrencyPolicy, SessionOpened
from runbus.messages.tools import ApprovalGrant, ApprovalRequest, ToolInvoked

from ..agents import CompactionPolicy, MemoryPolicy
from ..harness.state import StatePort


class RunPorts(StatePort, Protocol):
    """Everything a run does outside itself; one method per hop (the state-bag methods come
    from `StatePort`)."""

    async def open_session(self, ctx: RunContext, policy: ConcurrencyPolicy) -> SessionOpened: ...

    async def search_memory(
        self, ctx: RunContext, query: str, policy: MemoryPolicy
    ) -> list[MemoryHit]: ...

    async def list_tools(self, ctx: RunContext, names: list[str]) -> list[ToolSpec]: ...

    async def compact(
        self, ctx: RunContext, messages: list[ChatMessage], policy: CompactionPolicy
    ) -> CompactResult: ...

    async def complete(
        self,
        ctx: RunContext,
        route: str,
        messages: list[ChatMessage],
        tools: list[ToolSpec],
        message_id: str,
        settings: ModelSettings = ...,
        *,
        output: OutputFormat | None = None,
        stream: bool = True,
    ) -> ModelResponse:
        """`output`: the shape the answer must have; `stream`: publish the text deltas as the
        model writes (False: the run shows the text itself once it is checked)."""
        ...

    async def invoke_tool(
        self,
        ctx: RunContext,
        call: FunctionCallContent,
        approval: ApprovalGrant | None = None,
        *,
        first_send: bool = False,
    ) -> ToolInvoked:
        """`first_send`: this run never sent the call before (`ToolInvoke.first_send`)."""
        ...

    async def await_approval(
        self,
        ctx: RunContext,
        call: FunctionCallContent,
        request: ApprovalRequest,
        announce: Callable[[], Awaitable[None]],
    ) -> ApprovalGrant:
        """Record the request, then `announce` it, then wait for the decision: announced
        first, a person could decide before there was anything to decide."""
        ...

    async def hand_to_client(self, ctx: RunContext, call: FunctionCallContent) -> None:
        """Record a call of the client's own tools as pending (once), before the client can
        read it in the run's events."""
        ...

    async def await_client(
        self, ctx: RunContext, call: FunctionCallContent
    ) -> FunctionResultContent:
        """Wait for the client's answer to a recorded call (`client_tools.answer`)."""
        ...

    async def append_history(
        self,
        ctx: RunContext,
        messages: list[ChatMessage],
        *,
        release: bool = False,
        history_length: int | None = None,
        compaction: HistoryCompaction | None = None,
        history_end: int | None = None,
        incarnation: str = "",
        closes: bool = False,
    ) -> int | None:
        """Store `messages` (`release`: and release the session's claim; `closes`: the run
        finished, `HistoryAppend.closes`). `history_end` is
        where the session's stored batches end as far as the run knows (the last append's
        answer, or the session's as opened; None: unknown); the answer is where they end
        after this append, None when unknown. `incarnation` is the session's as opened: an
        append for a session deleted and made again since is refused (`not_found`)."""
        ...

    async def store_memory(self, ctx: RunContext, texts: list[str]) -> None: ...

    async def emit(self, ctx: RunContext, event: RunEvent, *, event_id: str) -> None: ...

    async def settle(self, ctx: RunContext) -> Collection[str]:
        """Wait until every event of the run emitted so far is stored; the ids (`event_id`)
        of those the stream already held."""
        ...

    async def checkpointed(self, ctx: RunContext) -> list[ChatMessage]:
        """The messages the run's stored events carry as checkpoints (a redelivered run's)."""
        ...
