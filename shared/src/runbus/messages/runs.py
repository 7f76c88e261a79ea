"""Run requests (`runbus.runs.<agent>`) and run events
(`runbus.events.<tenant>.<user_id>.<run_id>`)."""

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from ._base import Identifier, Message, Record
from .chat import ChatMessage, Usage
from .compaction import CompactionReport
from .contents import FunctionCallContent, FunctionResultContent
from .errors import ErrorInfo
from .model import OutputFormat, ToolSpec


class RunRequest(Message, frozen=True, tag="run.request"):
    run_id: Identifier
    """Caller-chosen id, also sent as `Nats-Msg-Id` so JetStream drops a re-publish."""
    agent: Identifier
    """Name of the agent definition to run."""
    session_id: Identifier
    """Conversation this run belongs to; created for the caller if new."""
    input: list[ChatMessage]
    """New messages from the caller (usually one user message)."""
    output_format: OutputFormat | None = None
    """The shape this run's answer must have, in place of the agent's own (`[output]`); None
    for the agent's."""
    client_tools: list[ToolSpec] = []
    """The caller's own tools, offered to the model besides the agent's: a call of one pauses
    the run until the caller answers it (`client_tools.answer`). Only an agent with
    `client_tools = true` takes them; names must be safe and not the agent's own."""
    parent_run_id: str = ""
    """Set by a gateway on a child run (an agent called as a tool): the run whose tool call
    started it. "" for a run a client started."""
    root_run_id: str = ""
    """The top-level run of a child's tree ("" for a run a client started)."""
    depth: Annotated[int, msgspec.Meta(ge=0)] = 0
    """How many parents the run has (0 for a run a client started); the gateway refuses a
    call past its depth limit."""


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
    finish_reason: str = ""
    """Set on the closing delta of a reply that was cut short (empty `delta`): `length` when
    the model hit `max_output_tokens`. Empty on every other delta."""


class RunToolCall(Message, frozen=True, tag="run.tool_call"):
    run_id: str
    """The run."""
    call: FunctionCallContent
    """The call the model asked for."""
    client: bool = False
    """The call is one of the caller's `client_tools`: it goes to the caller, and the run waits
    for the answer (`client_tools.answer`)."""
    client_calls: int = 0
    """How many calls of this step go to the caller (on each of the step's calls): a follower
    knows it has them all once it has seen that many."""
    checkpoint: list[ChatMessage] = []
    """On a step's first call: what the run produced since its last checkpoint (its input
    before the first step, the previous step's tool message, this step's reply with its calls),
    as the session's history will store it at the run's end. Stored before any call of the
    step runs; a resumed run continues from the checkpoints of its events. Empty otherwise."""


class RunToolResult(Message, frozen=True, tag="run.tool_result"):
    run_id: str
    """The run."""
    result: FunctionResultContent
    """What the tool returned (or its error)."""


class RunToolProgress(Message, frozen=True, tag="run.tool_progress"):
    """A call still working says how it is getting on: a remote agent's streamed status
    update (`[[remote_agents]]`), at most one stored every `PROGRESS_EVERY` seconds per call,
    never after the call's result."""

    run_id: str
    """The run."""
    call_id: str
    """The call it is about (`RunToolCall.call.call_id`)."""
    tool: str
    """The tool's name."""
    state: str
    """Where the call stands, in the remote protocol's words (A2A: `submitted`, `working`)."""
    text: str = ""
    """What it said (the status message's text), if anything."""


class RunApprovalRequested(Message, frozen=True, tag="run.approval_requested"):
    run_id: str
    """The run, paused until a person decides."""
    call_id: str
    """The call waiting; `runbus approve|deny <run_id> <call_id>` decides it."""
    tool: str
    """Tool it would run."""
    arguments: dict[str, Any]
    """Arguments it would run with."""
    reason: str
    """Why it needs approval."""
    expires_at: float
    """Epoch seconds after which it counts as denied."""
    question: bool = False
    """The tool asks the run's owner `reason`: approve with a note to answer it (the note is
    the answer), deny to decline."""


class RunPaused(Message, frozen=True, tag="run.paused"):
    run_id: str
    """The run, paused at a step boundary until its owner resumes it (`runs.resume`)."""
    step: int
    """Model replies stored before the pause."""
    calls: list[FunctionCallContent] = []
    """The calls of the model's last reply, not run yet: its owner may change their
    arguments or drop them (`runs.edit`) before resuming."""


class RunResumed(Message, frozen=True, tag="run.resumed"):
    run_id: str
    """The run, going on after a pause."""
    calls: list[FunctionCallContent] = []
    """The calls it runs next, as edited."""


class RunCompacted(Message, frozen=True, tag="run.compacted"):
    run_id: str
    """The run."""
    step: int
    """Model call (0-based) whose prompt was compacted."""
    report: CompactionReport
    """What compaction did (or why a triggered step changed nothing)."""


class RunCompleted(Message, frozen=True, tag="run.completed"):
    run_id: str
    """The run."""
    response: list[ChatMessage]
    """Every message this run produced (assistant and tool), in order."""
    text: str
    """The final assistant text."""
    usage: Usage = Usage()
    """Tokens summed over the run's model calls."""
    output: Any = None
    """The answer parsed as JSON and validated, for an agent or request with an output
    format; None otherwise."""


class RunFailed(Message, frozen=True, tag="run.failed"):
    run_id: str
    """The run (or the `Nats-Msg-Id` of a request too broken to name one)."""
    error: ErrorInfo
    """Why it failed."""


RunStatus = Literal[
    "queued", "running", "waiting_approval", "paused", "completed", "failed", "cancelled"
]


class RunRecord(Record, frozen=True):
    """What the gateway knows about a run, kept for a while after it ends."""

    run_id: str
    """The run."""
    agent: str
    """Its agent."""
    session_id: str
    """Its session."""
    tenant: str
    """Tenant of the caller who started it."""
    user_id: str
    """The caller who started it; only they can read or cancel it."""
    status: RunStatus
    """Where it stands."""
    created_at: datetime
    """First delivery to a gateway (UTC)."""
    updated_at: datetime
    """Last status change (UTC)."""
    attempts: int = 1
    """Deliveries so far (more than 1 after a gateway died or a retryable failure)."""
    text: str | None = None
    """Final answer, once completed."""
    error: ErrorInfo | None = None
    """Why it failed or was cancelled."""
    output: Any = None
    """The parsed answer of a run with an output format, once completed (`RunCompleted`)."""
    trace_id: str = ""
    """The trace the run is recorded in (32 hex digits, as Jaeger shows it): the one its request
    carried, else one the gateway started; "" from a gateway that did not record it."""
    parent_run_id: str = ""
    """The run whose agent called this one as a tool (`RunRequest.parent_run_id`); "" for a
    run a client started."""
    root_run_id: str = ""
    """The top-level run of its tree; "" for a run a client started."""
    depth: int = 0
    """How many parents it has."""


class RunGet(Message, frozen=True, tag="runs.get"):
    run_id: Identifier
    """Run to read."""


class RunInfo(Message, frozen=True, tag="runs.info"):
    record: RunRecord
    """The run."""
    pending_approvals: list[str] = []
    """While it is `waiting_approval`: the call ids of `run.approval_requested` that wait for
    a decision (`approvals.decide`), oldest first."""


class RunList(Message, frozen=True, tag="runs.list"):
    session_id: Identifier | None = None
    """Only runs of this session."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 50
    """At most this many, newest first."""
    parent_run_id: Identifier | None = None
    """Only the children of this run (the agents it called as tools)."""


class RunListed(Message, frozen=True, tag="runs.listed"):
    records: list[RunRecord]
    """The caller's runs, newest first."""


class ApprovalDecide(Message, frozen=True, tag="approvals.decide"):
    run_id: Identifier
    """Run whose call is decided (only its owner may decide)."""
    call_id: str
    """The call, as in `run.approval_requested`."""
    decision: Literal["approved", "denied"]
    """The person's decision."""
    note: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    """Shown to the model with a denial."""


class ApprovalDecided(Message, frozen=True, tag="approvals.decided"):
    run_id: str
    """The run."""
    call_id: str
    """The call."""
    decision: Literal["approved", "denied", "expired"]
    """What stands: the first decision wins."""


class ClientToolAnswer(Message, frozen=True, tag="client_tools.answer"):
    run_id: Identifier
    """Run waiting on the call (only its owner may answer)."""
    call_id: str
    """The call, as in `run.tool_call` (with `client` set)."""
    result: Any = None
    """What the caller's tool returned (text, or any JSON value)."""
    error: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    """Set instead of a result when the caller's tool failed."""


class ClientToolAnswered(Message, frozen=True, tag="client_tools.answered"):
    run_id: str
    """The run, now going on with the answer."""
    call_id: str
    """The call answered."""


class RunCancel(Message, frozen=True, tag="runs.cancel"):
    run_id: Identifier
    """Run to cancel; its checkpoint is kept and its session released."""


class RunPause(Message, frozen=True, tag="runs.pause"):
    run_id: Identifier
    """Run to pause at its next step boundary (before its next model call, or before the
    calls of the model's reply run); its slot is freed while it is paused."""


class RunPendingGet(Message, frozen=True, tag="runs.pending"):
    run_id: Identifier
    """Paused run whose pending step to read."""


class CallEdit(Record, frozen=True):
    call_id: str
    """A pending call, as in `run.paused`."""
    arguments: dict[str, Any]
    """Its new arguments, checked against the tool's schema as the model's would be."""


class RunEdit(Message, frozen=True, tag="runs.edit"):
    run_id: Identifier
    """Paused run to edit; it stays paused (`runs.resume` goes on)."""
    replace: list[CallEdit] = []
    """Calls whose arguments change."""
    drop: list[str] = []
    """Ids of calls not to run (the model never sees them)."""
    add: list[Annotated[str, msgspec.Meta(max_length=16384)]] = []
    """User messages the model reads next (after the results of the pending calls)."""


class RunPending(Message, frozen=True, tag="runs.pending_step"):
    run_id: str
    """The run."""
    status: Literal["requested", "paused", "resumed"]
    """`requested`: it pauses at its next step boundary; `paused`: it waits for `runs.resume`;
    `resumed`: it went on."""
    step: int = 0
    """Model replies stored before the pause."""
    calls: list[FunctionCallContent] = []
    """The model's last reply's calls, not run yet (as edited so far)."""
    messages: list[ChatMessage] = []
    """What is not stored yet: the model's reply holding `calls`, then the messages added."""
    tools: list[ToolSpec] = []
    """The tools of the pending calls, with the schemas their arguments must meet."""


class RunResume(Message, frozen=True, tag="runs.resume"):
    run_id: Identifier
    """Paused run to go on (a pause not reached yet is called off)."""


class RunFork(Message, frozen=True, tag="runs.fork"):
    run_id: Identifier
    """Run to fork (time travel): a new session starts from one of its checkpoints."""
    session_id: Identifier
    """The new session; it must not exist yet."""
    checkpoint: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """How many of the run's stored messages the new session keeps, after the history the
    run started from (0: none; 1: its input; then each model reply and tool result).
    None: all of them."""


class RunCheckpoint(Record, frozen=True):
    checkpoint: int
    """What `RunFork.checkpoint` names it by."""
    message_id: str
    """The last message a fork from here keeps."""
    role: str
    """That message's role."""


class RunForked(Message, frozen=True, tag="runs.forked"):
    run_id: str
    """The run forked."""
    session_id: str
    """The new session, holding the run's transcript up to the checkpoint as stored."""
    checkpoint: int
    """The checkpoint it starts from."""
    messages: int
    """Messages the new session holds."""
    checkpoints: list[RunCheckpoint] = []
    """Every checkpoint of the run (for the next fork)."""


class AgentList(Message, frozen=True, tag="agents.list"):
    """Ask for the agents the caller may run."""


class AgentSummary(Record, frozen=True):
    name: str
    """Name runs address the agent by."""
    description: str = ""
    """One line on what it does."""
    client_tools: bool = False
    """Whether its runs may bring the caller's own tools (`RunRequest.client_tools`)."""


class AgentListed(Message, frozen=True, tag="agents.listed"):
    agents: list[AgentSummary]
    """The agents, by name."""


RunEvent = (
    RunStarted
    | RunApprovalRequested
    | RunPaused
    | RunResumed
    | RunCompacted
    | RunTextDelta
    | RunToolCall
    | RunToolResult
    | RunToolProgress
    | RunCompleted
    | RunFailed
)

RUN_REQUEST_DECODER = msgspec.json.Decoder(RunRequest)
RUN_EVENT_DECODER = msgspec.json.Decoder(RunEvent)
RUN_RECORD_DECODER = msgspec.json.Decoder(RunRecord)
