"""Settle: the run's last checkpoint stored with the session's release while the context
providers finish (the memory store), then its answer as `run.completed`."""

import asyncio
import contextlib

import msgspec

from runbus.messages import RunCompleted, Usage

from .checkpoints import Checkpointer
from .output import checked
from .pause import PausePoint, Superseded
from .start import Run
from .state import RunState


async def settle(run: Run, state: RunState, usage: Usage) -> RunCompleted:
    """Store and release, then the answer: the response as the caller reads it, and its text
    (the last message's, or what ended the run)."""
    if run.pause is not None:
        # A delivery the server gave up on never closes the history of the one that took
        # the run over, nor answers for it.
        await run.pause.current(state.run_id)
    # Both finish before a failure of either is reported: the release is never left behind.
    for outcome in await asyncio.gather(
        state.checkpoints.close(history_length=state.history_length, finished=True),
        *(p.after_run(state) for p in run.providers),
        return_exceptions=True,
    ):
        if isinstance(outcome, BaseException):
            raise outcome
    response = [msgspec.structs.replace(m, source="external") for m in state.response]
    text = state.final_text if state.final_text is not None else response[-1].text
    # Checked before it was recorded; a run that ended on a tool's `terminate` is checked here.
    output, _ = checked(text, run.agent.output_format, repaired=True)
    return RunCompleted(
        run_id=state.run_id, response=response, text=text, usage=usage, output=output
    )


async def release(
    checkpoints: Checkpointer,
    state: RunState | None,
    pause: PausePoint | None = None,
    run_id: str = "",
) -> None:
    """Whatever stopped the run — even memory or the tool catalogue failing after the session
    was claimed — what it produced so far is saved and the session released before the
    failure is reported: the next run on the session finds it free and a valid prefix. Not by
    a delivery a later one took over (a partition cut it off): the session's claim and history
    are that one's now, and the same run id would release its claim and store its messages
    twice."""
    if pause is not None:
        try:
            await pause.current(run_id)
        except Superseded:
            return
        except Exception:
            pass  # unknown (the fence unreadable): released as before
    with contextlib.suppress(Exception):
        await checkpoints.close(history_length=len(state.prompt) if state else None)
