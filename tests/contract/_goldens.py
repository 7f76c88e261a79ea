"""The golden wire samples under `golden/` and the decoder each one is read with today.

A file is named `<tag>.json` or `<tag>--<variant>.json`; content parts are `content.<tag>.json`.
"""

import json
from pathlib import Path
from typing import Any, Final

import msgspec

from runbus.messages.auth import IDENTITY_DECODER, WHOAMI_DECODER
from runbus.messages.compaction import COMPACT_REQUEST_DECODER, COMPACT_RESULT_DECODER
from runbus.messages.contents import Content
from runbus.messages.errors import ERROR_DECODER
from runbus.messages.history import (
    HISTORY_APPEND_DECODER,
    HISTORY_APPENDED_DECODER,
    HISTORY_LOAD_DECODER,
    HISTORY_LOADED_DECODER,
)
from runbus.messages.memory import (
    MEMORY_FORGET_DECODER,
    MEMORY_FORGOTTEN_DECODER,
    MEMORY_HITS_DECODER,
    MEMORY_LIST_DECODER,
    MEMORY_LISTED_DECODER,
    MEMORY_SEARCH_DECODER,
    MEMORY_STATISTICS_DECODER,
    MEMORY_STATS_DECODER,
    MEMORY_STORE_DECODER,
    MEMORY_STORED_DECODER,
)
from runbus.messages.model import (
    MODEL_REQUEST_DECODER,
    MODEL_RESPONSE_DECODER,
    MODEL_USAGE_QUERY_DECODER,
    MODEL_USAGE_REPORT_DECODER,
)
from runbus.messages.progress import SERVICE_PROGRESS_DECODER
from runbus.messages.runs import (
    AGENT_LIST_DECODER,
    AGENT_LISTED_DECODER,
    APPROVAL_DECIDE_DECODER,
    APPROVAL_DECIDED_DECODER,
    RUN_CANCEL_DECODER,
    RUN_EVENT_DECODER,
    RUN_GET_DECODER,
    RUN_INFO_DECODER,
    RUN_LIST_DECODER,
    RUN_LISTED_DECODER,
    RUN_REQUEST_DECODER,
)
from runbus.messages.sessions import (
    SESSION_DELETE_DECODER,
    SESSION_DELETED_DECODER,
    SESSION_EXPORT_DECODER,
    SESSION_EXPORTED_DECODER,
    SESSION_GET_DECODER,
    SESSION_IMPORT_DECODER,
    SESSION_INFO_DECODER,
    SESSION_LIST_DECODER,
    SESSION_LISTED_DECODER,
    SESSION_OPEN_DECODER,
    SESSION_OPENED_DECODER,
    SESSION_STATE_UPDATE_DECODER,
)
from runbus.messages.tools import (
    TOOL_CATALOG_DECODER,
    TOOL_INVOKE_DECODER,
    TOOL_INVOKED_DECODER,
    TOOL_LIST_DECODER,
)

GOLDEN_DIR: Final = Path(__file__).parent / "golden"

# Content parts travel inside messages and have no decoder of their own; this one is built from
# today's `Content` union, the same type every message field holding a part uses.
CONTENT_DECODER: Final = msgspec.json.Decoder(Content)
CONTENT_PREFIX: Final = "content."

DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    "auth.whoami": WHOAMI_DECODER,
    "auth.identity": IDENTITY_DECODER,
    "run.request": RUN_REQUEST_DECODER,
    "run.started": RUN_EVENT_DECODER,
    "run.compacted": RUN_EVENT_DECODER,
    "run.text_delta": RUN_EVENT_DECODER,
    "run.tool_call": RUN_EVENT_DECODER,
    "run.tool_result": RUN_EVENT_DECODER,
    "run.completed": RUN_EVENT_DECODER,
    "run.failed": RUN_EVENT_DECODER,
    "run.approval_requested": RUN_EVENT_DECODER,
    "agents.list": AGENT_LIST_DECODER,
    "agents.listed": AGENT_LISTED_DECODER,
    "approvals.decide": APPROVAL_DECIDE_DECODER,
    "approvals.decided": APPROVAL_DECIDED_DECODER,
    "runs.get": RUN_GET_DECODER,
    "runs.info": RUN_INFO_DECODER,
    "runs.list": RUN_LIST_DECODER,
    "runs.listed": RUN_LISTED_DECODER,
    "runs.cancel": RUN_CANCEL_DECODER,
    "sessions.open": SESSION_OPEN_DECODER,
    "sessions.opened": SESSION_OPENED_DECODER,
    "sessions.get": SESSION_GET_DECODER,
    "sessions.info": SESSION_INFO_DECODER,
    "sessions.list": SESSION_LIST_DECODER,
    "sessions.listed": SESSION_LISTED_DECODER,
    "sessions.state.update": SESSION_STATE_UPDATE_DECODER,
    "sessions.export": SESSION_EXPORT_DECODER,
    "sessions.exported": SESSION_EXPORTED_DECODER,
    "sessions.import": SESSION_IMPORT_DECODER,
    "sessions.delete": SESSION_DELETE_DECODER,
    "sessions.deleted": SESSION_DELETED_DECODER,
    "model.usage_query": MODEL_USAGE_QUERY_DECODER,
    "model.usage_report": MODEL_USAGE_REPORT_DECODER,
    "history.append": HISTORY_APPEND_DECODER,
    "history.appended": HISTORY_APPENDED_DECODER,
    "history.load": HISTORY_LOAD_DECODER,
    "history.loaded": HISTORY_LOADED_DECODER,
    "memory.store": MEMORY_STORE_DECODER,
    "memory.stored": MEMORY_STORED_DECODER,
    "memory.search": MEMORY_SEARCH_DECODER,
    "memory.hits": MEMORY_HITS_DECODER,
    "memory.list": MEMORY_LIST_DECODER,
    "memory.listed": MEMORY_LISTED_DECODER,
    "memory.forget": MEMORY_FORGET_DECODER,
    "memory.forgotten": MEMORY_FORGOTTEN_DECODER,
    "service.progress": SERVICE_PROGRESS_DECODER,
    "memory.stats": MEMORY_STATS_DECODER,
    "memory.statistics": MEMORY_STATISTICS_DECODER,
    "compaction.compact": COMPACT_REQUEST_DECODER,
    "compaction.result": COMPACT_RESULT_DECODER,
    "model.complete": MODEL_REQUEST_DECODER,
    "model.response": MODEL_RESPONSE_DECODER,
    "tools.invoke": TOOL_INVOKE_DECODER,
    "tools.invoked": TOOL_INVOKED_DECODER,
    "tools.list": TOOL_LIST_DECODER,
    "tools.catalog": TOOL_CATALOG_DECODER,
    "error": ERROR_DECODER,
}

GOLDEN_FILES: Final = sorted(GOLDEN_DIR.glob("*.json"))


def tag_of(path: Path) -> str:
    """The `type` tag a golden file is a sample of, from its name."""
    name = path.name.removesuffix(".json").split("--")[0]
    return name.removeprefix(CONTENT_PREFIX)


def decoder_for(path: Path) -> msgspec.json.Decoder[Any]:
    if path.name.startswith(CONTENT_PREFIX):
        return CONTENT_DECODER
    return DECODERS[tag_of(path)]


def load(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(path.read_text())
    return value


def assert_wire_contains(encoded: Any, golden: Any, where: str = "$") -> None:
    """Every key and value of the golden sample is in the encoded form, at the same place.

    Catches a renamed defaulted field: the old sample still decodes (unknown keys are ignored)
    but today's producer no longer writes the name old consumers read.
    """
    if isinstance(golden, dict):
        assert isinstance(encoded, dict), f"{where}: expected an object, got {encoded!r}"
        for key, value in golden.items():
            assert key in encoded, f"{where}: today's encoding no longer writes {key!r}"
            assert_wire_contains(encoded[key], value, f"{where}.{key}")
    elif isinstance(golden, list):
        assert isinstance(encoded, list), f"{where}: expected an array, got {encoded!r}"
        assert len(encoded) == len(golden), f"{where}: length changed"
        for index, (got, want) in enumerate(zip(encoded, golden, strict=True)):
            assert_wire_contains(got, want, f"{where}[{index}]")
    else:
        assert encoded == golden, f"{where}: {encoded!r} != {golden!r}"
