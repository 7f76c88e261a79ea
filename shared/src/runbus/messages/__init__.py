"""Every wire type, one module per message family; import them from here."""

from ._base import Identifier, Message, Record, encode, is_identifier
from .chat import ChatMessage, Role, Source, Usage
from .compaction import CompactRequest, CompactResult, MessageGroup
from .contents import (
    Content,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    TextContent,
    UriContent,
    UsageContent,
)
from .errors import ErrorCode, ErrorInfo, ErrorReply
from .history import HistoryAppend, HistoryAppended, HistoryLoad, HistoryLoaded
from .memory import MemoryHit, MemoryHits, MemorySearch, MemoryStore, MemoryStored
from .model import ModelRequest, ModelResponse, ModelSettings, OutputFormat, ToolSpec
from .runs import (
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunRequest,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolResult,
)
from .tools import ToolCatalog, ToolInvoke, ToolInvoked, ToolList

__all__ = [
    "ChatMessage",
    "CompactRequest",
    "CompactResult",
    "Content",
    "DataContent",
    "ErrorCode",
    "ErrorInfo",
    "ErrorReply",
    "FunctionCallContent",
    "FunctionResultContent",
    "HistoryAppend",
    "HistoryAppended",
    "HistoryLoad",
    "HistoryLoaded",
    "Identifier",
    "MemoryHit",
    "MemoryHits",
    "MemorySearch",
    "MemoryStore",
    "MemoryStored",
    "Message",
    "MessageGroup",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "OutputFormat",
    "ReasoningContent",
    "Record",
    "Role",
    "RunApprovalRequested",
    "RunCompacted",
    "RunCompleted",
    "RunEvent",
    "RunFailed",
    "RunRequest",
    "RunStarted",
    "RunTextDelta",
    "RunToolCall",
    "RunToolResult",
    "Source",
    "TextContent",
    "ToolCatalog",
    "ToolInvoke",
    "ToolInvoked",
    "ToolList",
    "ToolSpec",
    "UriContent",
    "Usage",
    "UsageContent",
    "encode",
    "is_identifier",
]
