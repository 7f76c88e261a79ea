"""Run events rendered for a person (or as JSON lines for scripts)."""

import json
from typing import TextIO

import msgspec

from .messages import (
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolResult,
)


class EventPrinter:
    """Renders run events for a person: deltas as they come, tools as arrows."""

    def __init__(self, out: TextIO, *, as_json: bool = False) -> None:
        self.out = out
        self.as_json = as_json
        self._mid_line = False

    def __call__(self, event: RunEvent) -> None:
        if self.as_json:
            self.out.write(msgspec.json.encode(event).decode() + "\n")
            self.out.flush()
            return
        match event:
            case RunStarted():
                pass
            case RunApprovalRequested(call_id=call_id, tool=tool, reason=reason):
                self._line(
                    f"  ? {tool} needs approval: {reason}\n"
                    f"    runbus approve {event.run_id} {call_id}   (or: runbus deny …)"
                )
            case RunCompacted(report=report):
                self._line(
                    f"  (context compacted by {report.strategy}: {report.tokens_before} → "
                    f"{report.tokens_after} tokens)"
                )
            case RunTextDelta(delta=delta):
                if not self._mid_line:
                    self.out.write("  assistant: ")
                self.out.write(delta)
                self._mid_line = True
            case RunToolCall(call=call):
                self._line(f"  → {call.name} {json.dumps(call.arguments, ensure_ascii=False)}")
            case RunToolResult(result=result):
                shown = (
                    result.error
                    if result.error is not None
                    else json.dumps(result.result, ensure_ascii=False)
                )
                self._line(f"  ← {shown if len(shown) < 160 else shown[:157] + '...'}")
            case RunCompleted(text=text):
                if not self._mid_line and text:
                    self.out.write(f"  assistant: {text}")
                self.out.write("\n")
                self._mid_line = False
            case RunFailed(error=error):
                self._line(f"  run failed [{error.code}]: {error.message}")
        self.out.flush()

    def _line(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        self.out.write(text + "\n")
