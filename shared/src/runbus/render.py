"""Run events rendered for a person (or as JSON lines for scripts), and what a quiet run is
waiting on."""

import asyncio
import json
import time
from collections.abc import Iterable, Sequence
from typing import TextIO, assert_never

import msgspec

from .messages import (
    RunApprovalRequested,
    RunCompacted,
    RunCompleted,
    RunEvent,
    RunFailed,
    RunPaused,
    RunResumed,
    RunStarted,
    RunTextDelta,
    RunToolCall,
    RunToolProgress,
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
            case RunApprovalRequested(call_id=call_id, tool=tool, reason=reason, question=True):
                self._line(
                    f"  ? {tool} asks: {reason}\n"
                    f"    runbus approve {event.run_id} {call_id} --note '<your answer>'"
                    "   (or: runbus deny …)"
                )
            case RunApprovalRequested(call_id=call_id, tool=tool, reason=reason):
                self._line(
                    f"  ? {tool} needs approval: {reason}\n"
                    f"    runbus approve {event.run_id} {call_id}   (or: runbus deny …)"
                )
            case RunPaused(step=step, calls=calls):
                pending = ", ".join(f"{c.name} ({c.call_id})" for c in calls) or "no calls"
                self._line(
                    f"  || paused after step {step}: {pending}\n"
                    f"    runbus runs pending|edit|resume {event.run_id}"
                )
            case RunResumed():
                self._line("  |> resumed")
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
            case RunToolProgress(tool=tool, state=state, text=text):
                said = f": {text[:157] + '...' if len(text) > 160 else text}" if text else ""
                self._line(f"  … {tool} {state}{said}")
            case RunCompleted(text=text):
                if not self._mid_line and text:
                    self.out.write(f"  assistant: {text}")
                self.out.write("\n")
                self._mid_line = False
            case RunFailed(error=error):
                self._line(f"  run failed [{error.code}]: {error.message}")
            case _:
                assert_never(event)
        self.out.flush()

    def _line(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        self.out.write(text + "\n")


def waiting_on(event: RunEvent | None) -> str:
    """What a run is waiting on after `event` (None: nothing arrived yet), for a person."""
    match event:
        case None:
            return "waiting for the run to start (a gateway to take it)"
        case RunToolCall(call=call):
            return f"waiting for tool {call.name}"
        case RunToolProgress(tool=tool):
            return f"waiting for tool {tool}"
        case RunApprovalRequested(tool=tool):
            return f"waiting for a decision on {tool} (runbus approve/deny)"
        case RunPaused():
            return "paused: waiting for its owner to resume it (runbus runs resume)"
        case RunTextDelta():
            return "the model is still answering"
        case (
            RunStarted()
            | RunResumed()
            | RunCompacted()
            | RunToolResult()
            | RunCompleted()
            | RunFailed()
        ):
            return "waiting for the model"
        case _:
            assert_never(event)


class WaitNotice:
    """While no event arrives for `every` seconds, says every `every` seconds what the run
    waits on and for how long, so a slow model or tool does not look like a hang."""

    def __init__(self, out: TextIO, every: float = 5.0) -> None:
        self.out = out
        self.every = every
        self._last: RunEvent | None = None
        self._since = time.monotonic()

    def saw(self, event: RunEvent) -> None:
        self._last = event
        self._since = time.monotonic()

    async def run(self) -> None:
        """Until cancelled."""
        while True:
            await asyncio.sleep(self.every)
            quiet = time.monotonic() - self._since
            if quiet >= self.every:
                self.out.write(f"  … {waiting_on(self._last)} ({quiet:.0f} s)\n")
                self.out.flush()


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Rows under a header row, each column as wide as its widest cell (so a long id shifts
    nothing), two spaces apart; the last column is left ragged. No rows: the header alone."""
    lines = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(
            [*(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)), line[-1]]
        ).rstrip()
        for line in lines
    )
