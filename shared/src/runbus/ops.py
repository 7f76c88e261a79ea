"""Every request/reply operation, declared once: its subject, request type and reply type.

Callers send with `Bus.call(op, ...)` and services answer with `Endpoint.for_op(op, ...)`, so
a subject is never paired with a decoder by hand and a reply cannot be read as the wrong type.
"""

import functools
from typing import Any, Final, Generic, TypeVar

import msgspec

from . import subjects
from .messages.auth import Identity, WhoAmI
from .messages.compaction import CompactRequest, CompactResult
from .messages.history import HistoryAppend, HistoryAppended, HistoryLoad, HistoryLoaded
from .messages.memory import (
    MemoryForget,
    MemoryForgotten,
    MemoryHits,
    MemoryList,
    MemoryListed,
    MemorySearch,
    MemoryStatistics,
    MemoryStats,
    MemoryStore,
    MemoryStored,
)
from .messages.model import ModelRequest, ModelResponse, ModelUsageQuery, ModelUsageReport
from .messages.runs import (
    AgentList,
    AgentListed,
    ApprovalDecide,
    ApprovalDecided,
    ClientToolAnswer,
    ClientToolAnswered,
    RunCancel,
    RunEdit,
    RunFork,
    RunForked,
    RunGet,
    RunInfo,
    RunList,
    RunListed,
    RunPause,
    RunPending,
    RunPendingGet,
    RunResume,
)
from .messages.sessions import (
    SessionDelete,
    SessionDeleted,
    SessionExport,
    SessionExported,
    SessionGet,
    SessionImport,
    SessionInfo,
    SessionList,
    SessionListed,
    SessionOpen,
    SessionOpened,
    SessionStateUpdate,
)
from .messages.tools import ToolCatalog, ToolInvoke, ToolInvoked, ToolList

Req = TypeVar("Req", bound=msgspec.Struct)
Rep = TypeVar("Rep", bound=msgspec.Struct)


class Op(Generic[Req, Rep]):
    """One request/reply operation: where it is sent, what it carries, what comes back.

    The decoders are built once here and shared by every caller and endpoint of the operation.
    """

    __slots__ = ("decode", "decode_reply", "name", "reply", "request", "span_subject", "subject")

    def __init__(
        self,
        name: str,
        subject: str,
        request: type[Req],
        reply: type[Rep],
        *,
        span_subject: str | None = None,
    ) -> None:
        self.name = name
        """Endpoint name shown by `nats micro info` (letters, digits, `-`, `_`)."""
        self.subject = subject
        """Subject the operation is sent to and answered on."""
        self.span_subject = span_subject
        """Low-cardinality template for span names when `subject` carries a name or an id."""
        self.request = request
        self.reply = reply
        self.decode: msgspec.json.Decoder[Req] = msgspec.json.Decoder(request)
        """Decoder of the request body (the serving side)."""
        self.decode_reply: msgspec.json.Decoder[Rep] = msgspec.json.Decoder(reply)
        """Decoder of the reply body (the calling side)."""

    def __repr__(self) -> str:
        return f"Op({self.subject!r}, {self.request.__name__}, {self.reply.__name__})"


class NamedOp(Generic[Req, Rep]):
    """An operation with one subject per name (`runbus.tools.<name>.invoke`): `at(name)` is the
    operation for one name, sharing this family's decoders and span template."""

    def __init__(self, prefix: str, template: str, request: type[Req], reply: type[Rep]) -> None:
        self.prefix = prefix
        """Endpoint name prefix; the endpoint of `name` is `<prefix>-<name>`."""
        self.template = template
        """Subject template, also the span subject of every name."""
        self.family: Op[Req, Rep] = Op(prefix, template, request, reply, span_subject=template)

    def __repr__(self) -> str:
        return f"NamedOp({self.template!r})"

    def at(self, name: str) -> Op[Req, Rep]:
        op: Op[Req, Rep] = Op.__new__(Op)
        op.name = f"{self.family.name}-{name}"
        op.subject = self.template.format(name=name)
        op.span_subject = self.template
        op.request, op.reply = self.family.request, self.family.reply
        op.decode, op.decode_reply = self.family.decode, self.family.decode_reply
        return op


def _api(op: str, request: type[Req], reply: type[Rep]) -> Op[Req, Rep]:
    """A client API operation answered by the gateway on `runbus.api.<op>`."""
    name = f"api-{op.replace('.', '-')}"
    return Op(name, subjects.api(op), request, reply, span_subject=subjects.API_TEMPLATE)


HISTORY_APPEND: Final = Op("append", subjects.HISTORY_APPEND, HistoryAppend, HistoryAppended)
HISTORY_LOAD: Final = Op("load", subjects.HISTORY_LOAD, HistoryLoad, HistoryLoaded)
SESSIONS_OPEN: Final = Op("open", subjects.SESSIONS_OPEN, SessionOpen, SessionOpened)
SESSIONS_GET: Final = Op("get", subjects.SESSIONS_GET, SessionGet, SessionInfo)
SESSIONS_LIST: Final = Op("list", subjects.SESSIONS_LIST, SessionList, SessionListed)
SESSIONS_STATE_UPDATE: Final = Op(
    "state-update", subjects.SESSIONS_STATE_UPDATE, SessionStateUpdate, SessionInfo
)
SESSIONS_EXPORT: Final = Op("export", subjects.SESSIONS_EXPORT, SessionExport, SessionExported)
SESSIONS_IMPORT: Final = Op("import", subjects.SESSIONS_IMPORT, SessionImport, SessionInfo)
SESSIONS_DELETE: Final = Op("delete", subjects.SESSIONS_DELETE, SessionDelete, SessionDeleted)

MEMORY_STORE: Final = Op("store", subjects.MEMORY_STORE, MemoryStore, MemoryStored)
MEMORY_SEARCH: Final = Op("search", subjects.MEMORY_SEARCH, MemorySearch, MemoryHits)
MEMORY_FIND: Final = Op("find", subjects.MEMORY_FIND, MemorySearch, MemoryHits)
MEMORY_LIST: Final = Op("list", subjects.MEMORY_LIST, MemoryList, MemoryListed)
MEMORY_FORGET: Final = Op("forget", subjects.MEMORY_FORGET, MemoryForget, MemoryForgotten)
MEMORY_STATS: Final = Op("stats", subjects.MEMORY_STATS, MemoryStats, MemoryStatistics)

COMPACTION_COMPACT: Final = Op(
    "compact", subjects.COMPACTION_COMPACT, CompactRequest, CompactResult
)
MODEL_COMPLETE: Final = Op("complete", subjects.MODEL_COMPLETE, ModelRequest, ModelResponse)
MODEL_USAGE: Final = Op("usage", subjects.MODEL_USAGE, ModelUsageQuery, ModelUsageReport)

TOOLS_LIST: Final = Op("list", subjects.TOOLS_LIST, ToolList, ToolCatalog)
TOOL_INVOKE: Final = NamedOp("invoke", subjects.TOOL_INVOKE_TEMPLATE, ToolInvoke, ToolInvoked)

AUTH_WHOAMI: Final = Op("whoami", subjects.AUTH_WHOAMI, WhoAmI, Identity)

API_RUNS_GET: Final = _api("runs.get", RunGet, RunInfo)
API_RUNS_LIST: Final = _api("runs.list", RunList, RunListed)
API_RUNS_CANCEL: Final = _api("runs.cancel", RunCancel, RunInfo)
API_APPROVALS_DECIDE: Final = _api("approvals.decide", ApprovalDecide, ApprovalDecided)
API_CLIENT_TOOLS_ANSWER: Final = _api("client_tools.answer", ClientToolAnswer, ClientToolAnswered)
API_AGENTS_LIST: Final = _api("agents.list", AgentList, AgentListed)
API_RUNS_PAUSE: Final = _api("runs.pause", RunPause, RunPending)
API_RUNS_PENDING: Final = _api("runs.pending", RunPendingGet, RunPending)
API_RUNS_EDIT: Final = _api("runs.edit", RunEdit, RunPending)
API_RUNS_RESUME: Final = _api("runs.resume", RunResume, RunPending)
API_RUNS_FORK: Final = _api("runs.fork", RunFork, RunForked)

FORWARDED: Final[tuple[Op[Any, Any], ...]] = (
    MEMORY_LIST,
    MEMORY_FIND,
    MEMORY_FORGET,
    MEMORY_STATS,
    SESSIONS_GET,
    SESSIONS_LIST,
    SESSIONS_STATE_UPDATE,
    SESSIONS_EXPORT,
    SESSIONS_IMPORT,
    SESSIONS_DELETE,
    HISTORY_LOAD,
)
"""Service operations a client reaches through the gateway's API (`runbus.api.<op>`), which
authenticates the caller and forwards the body as it is."""


@functools.cache
def api_op(op: Op[Req, Rep]) -> Op[Req, Rep]:
    """The client API operation (`runbus.api.<op>`) a forwarded service operation is reached
    by: same request and reply, authenticated by the gateway on the way."""
    return _api(op.subject.removeprefix(f"{subjects.PREFIX}."), op.request, op.reply)


ALL: Final[tuple[Op[Any, Any] | NamedOp[Any, Any], ...]] = (
    HISTORY_APPEND,
    HISTORY_LOAD,
    SESSIONS_OPEN,
    SESSIONS_GET,
    SESSIONS_LIST,
    SESSIONS_STATE_UPDATE,
    SESSIONS_EXPORT,
    SESSIONS_IMPORT,
    SESSIONS_DELETE,
    MEMORY_STORE,
    MEMORY_SEARCH,
    MEMORY_FIND,
    MEMORY_LIST,
    MEMORY_FORGET,
    MEMORY_STATS,
    COMPACTION_COMPACT,
    MODEL_COMPLETE,
    MODEL_USAGE,
    TOOLS_LIST,
    TOOL_INVOKE,
    AUTH_WHOAMI,
    API_RUNS_GET,
    API_RUNS_LIST,
    API_RUNS_CANCEL,
    API_APPROVALS_DECIDE,
    API_CLIENT_TOOLS_ANSWER,
    API_AGENTS_LIST,
    API_RUNS_PAUSE,
    API_RUNS_PENDING,
    API_RUNS_EDIT,
    API_RUNS_RESUME,
    API_RUNS_FORK,
)
"""Every operation, for checks that nothing answers or sends outside this list."""
