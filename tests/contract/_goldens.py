"""The golden wire samples under `golden/` and the decoder each one is read with today (the
operation's own decoder where the message is an operation's request or reply).

A file is named `<tag>.json` or `<tag>--<variant>.json`; content parts are `content.<tag>.json`.
"""

import json
from pathlib import Path
from typing import Any, Final

import msgspec

from runbus import ops
from runbus.messages.contents import Content
from runbus.messages.errors import ERROR_DECODER
from runbus.messages.progress import SERVICE_PROGRESS_DECODER
from runbus.messages.runs import RUN_EVENT_DECODER, RUN_REQUEST_DECODER

GOLDEN_DIR: Final = Path(__file__).parent / "golden"

# Content parts travel inside messages and have no decoder of their own; this one is built from
# today's `Content` union, the same type every message field holding a part uses.
CONTENT_DECODER: Final = msgspec.json.Decoder(Content)
CONTENT_PREFIX: Final = "content."

DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    "auth.whoami": ops.AUTH_WHOAMI.decode,
    "auth.identity": ops.AUTH_WHOAMI.decode_reply,
    "run.request": RUN_REQUEST_DECODER,
    "run.started": RUN_EVENT_DECODER,
    "run.compacted": RUN_EVENT_DECODER,
    "run.text_delta": RUN_EVENT_DECODER,
    "run.tool_call": RUN_EVENT_DECODER,
    "run.tool_result": RUN_EVENT_DECODER,
    "run.tool_progress": RUN_EVENT_DECODER,
    "run.completed": RUN_EVENT_DECODER,
    "run.failed": RUN_EVENT_DECODER,
    "run.approval_requested": RUN_EVENT_DECODER,
    "run.paused": RUN_EVENT_DECODER,
    "run.resumed": RUN_EVENT_DECODER,
    "runs.pause": ops.API_RUNS_PAUSE.decode,
    "runs.pending": ops.API_RUNS_PENDING.decode,
    "runs.pending_step": ops.API_RUNS_PENDING.decode_reply,
    "runs.edit": ops.API_RUNS_EDIT.decode,
    "runs.resume": ops.API_RUNS_RESUME.decode,
    "runs.fork": ops.API_RUNS_FORK.decode,
    "runs.forked": ops.API_RUNS_FORK.decode_reply,
    "agents.list": ops.API_AGENTS_LIST.decode,
    "agents.listed": ops.API_AGENTS_LIST.decode_reply,
    "approvals.decide": ops.API_APPROVALS_DECIDE.decode,
    "approvals.decided": ops.API_APPROVALS_DECIDE.decode_reply,
    "client_tools.answer": ops.API_CLIENT_TOOLS_ANSWER.decode,
    "client_tools.answered": ops.API_CLIENT_TOOLS_ANSWER.decode_reply,
    "runs.get": ops.API_RUNS_GET.decode,
    "runs.info": ops.API_RUNS_GET.decode_reply,
    "runs.list": ops.API_RUNS_LIST.decode,
    "runs.listed": ops.API_RUNS_LIST.decode_reply,
    "runs.cancel": ops.API_RUNS_CANCEL.decode,
    "sessions.open": ops.SESSIONS_OPEN.decode,
    "sessions.opened": ops.SESSIONS_OPEN.decode_reply,
    "sessions.get": ops.SESSIONS_GET.decode,
    "sessions.info": ops.SESSIONS_GET.decode_reply,
    "sessions.list": ops.SESSIONS_LIST.decode,
    "sessions.listed": ops.SESSIONS_LIST.decode_reply,
    "sessions.state.update": ops.SESSIONS_STATE_UPDATE.decode,
    "sessions.export": ops.SESSIONS_EXPORT.decode,
    "sessions.exported": ops.SESSIONS_EXPORT.decode_reply,
    "sessions.import": ops.SESSIONS_IMPORT.decode,
    "sessions.delete": ops.SESSIONS_DELETE.decode,
    "sessions.deleted": ops.SESSIONS_DELETE.decode_reply,
    "model.usage_query": ops.MODEL_USAGE.decode,
    "model.usage_report": ops.MODEL_USAGE.decode_reply,
    "history.append": ops.HISTORY_APPEND.decode,
    "history.appended": ops.HISTORY_APPEND.decode_reply,
    "history.load": ops.HISTORY_LOAD.decode,
    "history.loaded": ops.HISTORY_LOAD.decode_reply,
    "memory.store": ops.MEMORY_STORE.decode,
    "memory.stored": ops.MEMORY_STORE.decode_reply,
    "memory.search": ops.MEMORY_SEARCH.decode,
    "memory.hits": ops.MEMORY_SEARCH.decode_reply,
    "memory.list": ops.MEMORY_LIST.decode,
    "memory.listed": ops.MEMORY_LIST.decode_reply,
    "memory.forget": ops.MEMORY_FORGET.decode,
    "memory.forgotten": ops.MEMORY_FORGET.decode_reply,
    "service.progress": SERVICE_PROGRESS_DECODER,
    "memory.stats": ops.MEMORY_STATS.decode,
    "memory.statistics": ops.MEMORY_STATS.decode_reply,
    "compaction.compact": ops.COMPACTION_COMPACT.decode,
    "compaction.result": ops.COMPACTION_COMPACT.decode_reply,
    "model.complete": ops.MODEL_COMPLETE.decode,
    "model.response": ops.MODEL_COMPLETE.decode_reply,
    "tools.invoke": ops.TOOL_INVOKE.family.decode,
    "tools.invoked": ops.TOOL_INVOKE.family.decode_reply,
    "tools.list": ops.TOOLS_LIST.decode,
    "tools.catalog": ops.TOOLS_LIST.decode_reply,
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
