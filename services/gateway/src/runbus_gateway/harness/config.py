"""The `[harness]` table of an agent file: guardrails, output rewriters, error messages, the
todo list, modes, loop mode, and the agent's kind (a chat model, or a Python program).

Everything is off by default, so an agent without the table runs as before. Plug-in tables
(guardrails, rewriters, evaluators) and the program path are checked when the file is decoded:
an unknown name fails the agent file, naming it.
"""

from typing import Annotated, Any, Literal

import msgspec

from runbus.modes import Mode
from runbus.todos import TodoListFormat

from .evaluators import DEFAULT_MAX_LOOP_ITERATIONS
from .user_errors import ErrorMessages

Table = dict[str, Any]
"""One plug-in's TOML table: `name` plus its parameters."""


class TodosConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    enabled: bool = False
    """Give the model the todo tools, their instructions and the per-turn list message."""
    instructions: str | None = None
    """Replaces the default todo instructions entirely."""
    inject_message: bool = True
    """Read the current list to the model before each model call (`### Current todo list`)."""
    format: TodoListFormat = TodoListFormat()
    """How that message reads (header, item lines, empty line)."""


class ModesConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    enabled: bool = False
    """Give the model `mode_get`/`mode_set` and the mode instructions."""
    default: Mode = "plan"
    """Mode of a session that has none stored."""
    instructions: str | None = None
    """Replaces the default mode instructions; `{modes}` and `{mode}` are filled in."""


class LoopConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    enabled: bool = False
    """After the model answers, ask the evaluators whether to make another pass."""
    evaluators: list[Table] = msgspec.field(default_factory=lambda: [{"name": "todos_open"}])
    """Evaluators in priority order."""
    max_loop_iterations: Annotated[int, msgspec.Meta(ge=1, le=100)] = DEFAULT_MAX_LOOP_ITERATIONS
    """Passes per run at most, whatever the evaluators say."""


class HarnessConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    kind: Literal["chat", "program"] = "chat"
    """`chat`: the model loop. `program`: the Python class named by `program` answers."""
    program: str | None = None
    """`module:Class` of a program agent (kind `program`)."""
    program_options: Table = {}
    """Keyword arguments the program class is built with."""
    guardrails: list[Table] = []
    """Input guardrails in order (`{name = "pii"}`); the first refusal ends the run."""
    rewriters: list[Table] = []
    """Output rewriters in order (`{name = "disclaimer", text = "…"}`)."""
    errors: ErrorMessages = ErrorMessages()
    """What a user reads when a run fails."""
    todos: TodosConfig = TodosConfig()
    modes: ModesConfig = ModesConfig()
    loop: LoopConfig = LoopConfig()
