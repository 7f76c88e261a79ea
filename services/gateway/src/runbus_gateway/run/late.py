"""A run that waited for a person past its deadline gives its delivery back: the next one has
a deadline (and a claim on the session) of its own and goes on from where the wait ended."""

from typing import Final

from runbus.errors import Unavailable
from runbus.headers import RunContext

RESUME_WITHIN: Final = 30.0
"""Seconds of its deadline a run needs left, after waiting for a person, to go on in the same
delivery."""


def hand_back_if_late(ctx: RunContext, waited_for: str, *, had: float | None = None) -> None:
    """Raise `Unavailable` (retried: a new delivery) when under `RESUME_WITHIN` seconds of
    the run's deadline are left. What the person decided is stored where the next delivery
    finds it (the pause record, the approval record), so nothing is asked twice. `had`: the
    seconds left when the wait began, if known; a wait that began with too little time left
    already (a run timeout under `RESUME_WITHIN`, or a delivery reading a stored answer)
    gives nothing back."""
    left = ctx.time_left()
    if had is not None and had < RESUME_WITHIN:
        return
    if left is not None and left < RESUME_WITHIN:
        raise Unavailable(
            f"run {ctx.run_id!r} waited for {waited_for} past its deadline; it goes on anew"
        )
