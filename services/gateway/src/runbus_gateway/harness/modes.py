"""Agent modes: `plan` (work the request out with the user) and `execute` (work through it
alone). The mode lives in the session's state bag (`runbus.modes`); the model reads it with
`mode_get` and switches with `mode_set`, a host switches it without a model call, and the model
is told of a host's switch once, at the start of its next run.
"""

from typing import Final

import msgspec

from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    ToolSpec,
)
from runbus.modes import MODES, STATE_KEY, Mode, ModeState

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "MODE_DESCRIPTIONS",
    "STATE_KEY",
    "TOOL_NAMES",
    "TOOL_SPECS",
    "ModeState",
    "acknowledged",
    "apply",
    "instructions",
    "notification",
]

MODE_DESCRIPTIONS: Final[dict[Mode, str]] = {
    "plan": (
        "Work the request out with the user. Ask clarifying questions one at a time (offer the "
        "options you have in mind), break the work into todo items, present the plan and ask "
        "for approval. When the user approves, switch to execute mode with mode_set."
    ),
    "execute": (
        "A simple question: answer it directly. Anything else: work on your own without "
        "waiting for the user. Make a plan and todo items if there are none yet, resolve "
        "ambiguity with the most reasonable choice (and say which), mark items complete as "
        "you finish them, and keep going until the result is ready."
    ),
}

DEFAULT_INSTRUCTIONS: Final = """\
## Mode

You work in one of these modes; each asks for its own way of working.
Use mode_get to check the mode and mode_set to switch, but only switch when the user asks
you to or allows it.

{modes}

You are in {mode} mode now.
"""


class SetArgs(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    mode: Mode


class NoArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


TOOL_SPECS: Final = [
    ToolSpec(
        name="mode_get",
        description="The mode you are working in now.",
        parameters={
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        name="mode_set",
        description=f"Switch the mode you work in: {' or '.join(MODES)}.",
        parameters={
            "type": "object",
            "properties": {"mode": {"type": "string", "enum": list(MODES)}},
            "required": ["mode"],
            "additionalProperties": False,
        },
    ),
]
TOOL_NAMES: Final = frozenset(spec.name for spec in TOOL_SPECS)


def apply(state: ModeState, call: FunctionCallContent) -> tuple[ModeState, FunctionResultContent]:
    """Run one mode tool call: the new state (the same object when nothing changed) and the
    result the model reads. A switch by the model needs no notification: it made it."""
    try:
        match call.name:
            case "mode_get":
                msgspec.convert(call.arguments, NoArgs)
                return state, FunctionResultContent(call_id=call.call_id, result=state.mode)
            case "mode_set":
                mode = msgspec.convert(call.arguments, SetArgs).mode
            case _:
                return state, FunctionResultContent(
                    call_id=call.call_id, error=f"no mode tool named {call.name[:64]!r}"
                )
    except msgspec.ValidationError as exc:
        return state, FunctionResultContent(
            call_id=call.call_id, error=f"{call.name}: invalid arguments: {exc}"
        )
    changed = ModeState(mode=mode)
    return (
        state if changed == state else changed,
        FunctionResultContent(call_id=call.call_id, result=f"mode is now {mode!r}"),
    )


def instructions(state: ModeState, template: str = DEFAULT_INSTRUCTIONS) -> str:
    """The mode section of the system prompt (`{modes}` and `{mode}` filled in)."""
    modes = "\n\n".join(f"### {name}\n\n{text}" for name, text in MODE_DESCRIPTIONS.items())
    return template.replace("{modes}", modes).replace("{mode}", state.mode)


def notification(state: ModeState) -> ChatMessage | None:
    """The message that tells the model a host switched the mode, if one did since its last
    run: a user message stamped `context_provider` (never stored)."""
    if state.changed_from is None:
        return None
    text = (
        f"[Mode changed: the user switched the mode from {state.changed_from!r} to "
        f"{state.mode!r}. Work the {state.mode!r} way from now on.]"
    )
    return ChatMessage(
        role="user",
        contents=[TextContent(text=text)],
        message_id="mode-notice",
        source="context_provider",
    )


def acknowledged(state: ModeState) -> ModeState:
    """The state once the model has been told (store it after the notification went out)."""
    return state if state.changed_from is None else ModeState(mode=state.mode)
