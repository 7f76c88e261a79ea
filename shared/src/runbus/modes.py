"""The agent mode as it lives in a session's state bag (key `mode`): `plan` or `execute`.

The gateway's harness reads it into the instructions and lets the model change it (`mode_set`);
a host changes it without a model call (`runbus chat`'s `/mode`), which leaves a note so the
model is told of the switch at the start of its next run.
"""

from typing import Any, Final, Literal, get_args

import msgspec

STATE_KEY: Final = "mode"
"""Key of the mode in the session state bag."""

Mode = Literal["plan", "execute"]
MODES: Final[tuple[Mode, ...]] = get_args(Mode)


class ModeState(msgspec.Struct, kw_only=True, frozen=True):
    mode: Mode
    """The mode the agent works in now."""
    changed_from: Mode | None = None
    """Set when the host switched the mode and the model has not been told yet."""


def load(value: Any, default: Mode = "plan") -> ModeState:
    """The mode stored under `STATE_KEY` (None: the agent's default).

    Raises `msgspec.ValidationError` when the stored value is not a mode.
    """
    if value is None:
        return ModeState(mode=default)
    return msgspec.convert(value, ModeState)


def dump(state: ModeState) -> dict[str, Any]:
    """The JSON value to store under `STATE_KEY`."""
    value: dict[str, Any] = msgspec.to_builtins(state)
    return value


def host_set(current: ModeState, mode: Mode) -> ModeState:
    """The state after a host (not the model) switches to `mode`; a real change is remembered
    so the model hears about it once (and a switch back before it heard is no change)."""
    if mode == current.mode:
        return current
    told = current.changed_from or current.mode
    return ModeState(mode=mode, changed_from=None if told == mode else told)
