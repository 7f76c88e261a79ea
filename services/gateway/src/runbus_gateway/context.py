"""What a run starts from: the caller's input stamped with ids, the session opened and claimed,
memory recalled, the tool catalogue, and the prompt assembled from them."""

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Final

import msgspec

from runbus.errors import BadRequest, RemoteError
from runbus.headers import RunContext
from runbus.messages import ChatMessage, MemoryHit, RunRequest, TextContent, ToolSpec
from runbus.messages.history import REPAIR_SUFFIX
from runbus.messages.memory import MEMORY_SEARCH_TOOL
from runbus.messages.sessions import SessionOpened

from .agents import AgentSpec
from .checkpoints import Progress, message_id
from .errors import InputTooLarge
from .harness.runtime import Harness
from .harness.state import SessionState
from .recall import recall_message
from .run_ports import RunPorts

MAX_INPUT_BYTES: Final = 256 * 1024


def stamp_input(request: RunRequest, now: datetime) -> list[ChatMessage]:
    """Caller messages with ids derived from the run id, so a redelivered run stores them once.

    Only `user` messages are accepted: `system` is the trusted role and a caller-made
    `assistant` or `tool` message would put words in the model's or a tool's mouth.
    """
    size = 0
    for index, message in enumerate(request.input):
        if message.role != "user":
            raise BadRequest(
                f"input[{index}].role is {message.role!r}; a run request carries user messages",
                details={"field": f"input[{index}].role"},
            )
        size += len(message.text.encode())
    if size > MAX_INPUT_BYTES:
        raise InputTooLarge(size, MAX_INPUT_BYTES)
    return [
        msgspec.structs.replace(
            message,
            message_id=message_id(request.run_id, f"in{index}"),
            created_at=message.created_at or now,
            source="external",
        )
        for index, message in enumerate(request.input)
    ]


async def open_session(ports: RunPorts, ctx: RunContext, agent: AgentSpec) -> SessionOpened:
    """Open and claim the session; with policy `enqueue`, wait while another run holds it."""
    delay = 0.02
    while True:
        try:
            return await ports.open_session(ctx, agent.concurrency)
        except RemoteError as exc:
            if exc.remote_code != "session_busy" or agent.concurrency != "enqueue":
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)


@dataclass
class Start:
    """What a run starts from, assembled once."""

    inputs: list[ChatMessage]
    """This run's input: the resumed copy from history, else the request's."""
    resumed_inputs: list[ChatMessage]
    earlier: list[ChatMessage]
    """The session's history before this run."""
    recalled: ChatMessage | None
    notice: ChatMessage | None
    """The mode's notice, shown once after a mode change."""
    state: SessionState
    tools: list[ToolSpec]
    prompt: list[ChatMessage]
    progress: Progress
    history_end: int | None = None
    """Stream sequence of the session's last stored batch when it was opened (0: none; None:
    unknown): where this run's first checkpoint may be stored directly."""
    incarnation: str = ""
    """The session's incarnation as opened: what the run's checkpoints are stored for."""


async def assemble(
    ctx: RunContext,
    agent: AgentSpec,
    ports: RunPorts,
    harness: Harness,
    inputs: list[ChatMessage],
) -> Start:
    """Open the session, recall memory and list the tools at once, then build the prompt:
    instructions, recalled memory, the history, the mode notice, the input, and whatever this
    run already produced (a resumed run continues after it)."""
    query = inputs[-1].text if inputs else ""

    async def no_hits() -> list[MemoryHit]:
        return []

    opened, hits, tools = await asyncio.gather(
        open_session(ports, ctx, agent),
        ports.search_memory(ctx, query, agent.memory)
        if agent.memory.searches_before_invoke and query
        else no_hits(),
        ports.list_tools(ctx, agent.tools),
    )
    if agent.memory.offers_tool:
        tools = [*tools, MEMORY_SEARCH_TOOL]
    tools = [*tools, *harness.tools]
    state = SessionState(ports, ctx, opened.record)
    own = message_id(ctx.run_id, "")
    earlier = [m for m in opened.messages if not m.message_id.startswith(own)]
    mine = [
        m
        for m in opened.messages
        if m.message_id.startswith(own) and not m.message_id.endswith(REPAIR_SUFFIX)
    ]
    progress = Progress.from_history(ctx.run_id, mine)
    instructions = ChatMessage(
        role="system",
        contents=[TextContent(text=agent.instructions.strip())],
        message_id="instructions",
        source="context_provider",
    )
    recalled = recall_message(hits)
    resumed_inputs = [m for m in mine if m.role == "user" and ":in" in m.message_id]
    notice = harness.mode_notice(state.bag)
    prompt = [
        instructions,
        *([recalled] if recalled else []),
        *earlier,
        *([notice] if notice else []),
        *(resumed_inputs or inputs),
        *progress.response,
    ]
    return Start(
        inputs=resumed_inputs or inputs,
        resumed_inputs=resumed_inputs,
        earlier=earlier,
        recalled=recalled,
        notice=notice,
        state=state,
        tools=tools,
        prompt=prompt,
        progress=progress,
        history_end=opened.history_end,
        incarnation=opened.record.incarnation,
    )
