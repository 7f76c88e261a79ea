"""Run requests (`runbus.runs.<agent>`) and run events (`runbus.events.<run_id>`)."""

import msgspec

from ._base import Identifier, Message
from .chat import ChatMessage, Usage
from .contents import FunctionCallContent, FunctionResultContent
from .errors import ErrorInfo


class RunRequest(Message, frozen=True, tag="run.request"):
    run_id: Identifier
    """Caller-chosen id, also sent as `Nats-Msg-Id` so JetStream drops a re-publish."""
    agent: Identifier
    """Name of the agent definition to run."""
    session_id: Identifier
    """Conversation this run belongs to; created for the caller if new."""
    input: list[ChatMessage]
    """New messages from the caller (usually one user message)."""


class RunStarted(Message, frozen=True, tag="run.started"):
    run_id: str
    """The run."""
    session_id: str
    """Its session."""
    agent: str
    """Its agent."""


class RunTextDelta(Message, frozen=True, tag="run.text_delta"):
    run_id: str
    """The run."""
    message_id: str
    """Assistant message the delta belongs to."""
    delta: str
    """Next piece of text, in order."""


class RunToolCall(Message, frozen=True, tag="run.tool_call"):
    run_id: str
    """The run."""
    call: FunctionCallContent
    """The call the model asked for."""


class RunToolResult(Message, frozen=True, tag="run.tool_result"):
    run_id: str
    """The run."""
    result: FunctionResultContent
    """What the tool returned (or its error)."""


class RunCompleted(Message, frozen=True, tag="run.completed"):
    run_id: str
    """The run."""
    response: list[ChatMessage]
    """Every message this run produced (assistant and tool), in order."""
    text: str
    """The final assistant text."""
    usage: Usage = Usage()
    """Tokens summed over the run's model calls."""


class RunFailed(Message, frozen=True, tag="run.failed"):
    run_id: str
    """The run (or the `Nats-Msg-Id` of a request too broken to name one)."""
    error: ErrorInfo
    """Why it failed."""


RunEvent = RunStarted | RunTextDelta | RunToolCall | RunToolResult | RunCompleted | RunFailed

RUN_REQUEST_DECODER = msgspec.json.Decoder(RunRequest)
RUN_EVENT_DECODER = msgspec.json.Decoder(RunEvent)
