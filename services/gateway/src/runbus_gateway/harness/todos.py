"""The todo list the model keeps while it works (seed 000, MAF's `TodoProvider`): five tools run
by the gateway itself, the instructions that tell the model when to use them, and the per-turn
message that reads the current list back to it.

The list lives in the session's state bag (`runbus.todos`), so it survives compaction (it is not
a chat message), restarts, and moving between gateway replicas. `apply` is pure: the caller
reads the stored list, applies one call and writes the result back with compare-and-set.
"""

from typing import Annotated, Any, Final, TypeVar

import msgspec

from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    ToolSpec,
)
from runbus.todos import DEFAULT_FORMAT, STATE_KEY, TodoItem, TodoListFormat, TodoState, render

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "STATE_KEY",
    "TOOL_NAMES",
    "TOOL_SPECS",
    "TodoItem",
    "TodoState",
    "apply",
    "context_message",
]

MAX_TITLE: Final = 200
MAX_DESCRIPTION: Final = 2000
MAX_ITEMS: Final = 100
"""Items a list holds at most (open and done); keeps the session record small."""

DEFAULT_INSTRUCTIONS: Final = """\
## Todo list

You have a todo list for this conversation; it is shown to you as "### Current todo list".
- First decide whether a request is complex (several steps) or simple (one step).
- Simple: just do it. Do not create todo items for it.
- Complex: break it into clear items and add them with todos_add, several in one call.
- If the request is unclear, ask the user before you plan, then create the items.
- When the user gives feedback on the plan, add or remove items to match it. When the user
  changes topic or changes their mind, remove the items that no longer apply.
- While you work, mark items done with todos_complete as soon as they are finished (give a
  short reason saying how), and remove items that are no longer needed with todos_remove.
- todos_get_remaining and todos_get_all read the list.
"""


class TodoInput(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    title: str
    description: str | None = None


class CompleteInput(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    id: int
    reason: str


class AddArgs(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    todos: Annotated[list[TodoInput], msgspec.Meta(min_length=1)]


class CompleteArgs(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    items: Annotated[list[CompleteInput], msgspec.Meta(min_length=1)]


class RemoveArgs(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    ids: Annotated[list[int], msgspec.Meta(min_length=1)]


class NoArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_TITLE: Final = {"type": "string", "minLength": 1, "maxLength": MAX_TITLE}
TOOL_SPECS: Final = [
    ToolSpec(
        name="todos_add",
        description=(
            "Add one or more todo items, each with a title and an optional description. "
            "Returns the created items with their ids."
        ),
        parameters=_object(
            {
                "todos": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {
                            "title": _TITLE,
                            "description": {"type": "string", "maxLength": MAX_DESCRIPTION},
                        },
                        ["title"],
                    ),
                }
            },
            ["todos"],
        ),
    ),
    ToolSpec(
        name="todos_complete",
        description=(
            "Mark one or more todo items complete. Each entry has the item's id and a reason "
            "saying how it was completed. Returns how many open items were marked complete."
        ),
        parameters=_object(
            {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {"id": {"type": "integer"}, "reason": {"type": "string"}},
                        ["id", "reason"],
                    ),
                }
            },
            ["items"],
        ),
    ),
    ToolSpec(
        name="todos_remove",
        description=(
            "Remove one or more todo items by id. Returns how many items were found and removed."
        ),
        parameters=_object(
            {"ids": {"type": "array", "minItems": 1, "items": {"type": "integer"}}}, ["ids"]
        ),
    ),
    ToolSpec(
        name="todos_get_remaining",
        description="The todo items that are not complete yet.",
        parameters=_object({}, []),
    ),
    ToolSpec(
        name="todos_get_all",
        description="Every todo item, complete and not.",
        parameters=_object({}, []),
    ),
]
TOOL_NAMES: Final = frozenset(spec.name for spec in TOOL_SPECS)


A = TypeVar("A", bound=msgspec.Struct)


class _Refused(Exception):
    """A call the model must correct; its text is the error result."""


def _trimmed(value: str | None, field: str, limit: int) -> str | None:
    if value is None:
        return None
    text = value.strip()
    if len(text) > limit:
        raise _Refused(f"{field} is {len(text)} characters; at most {limit}")
    return text or None


def _add(state: TodoState, args: AddArgs) -> tuple[TodoState, list[TodoItem]]:
    if len(state.items) + len(args.todos) > MAX_ITEMS:
        raise _Refused(
            f"the list holds at most {MAX_ITEMS} items and has {len(state.items)}; "
            "remove finished items first"
        )
    created = []
    for index, todo in enumerate(args.todos):
        title = _trimmed(todo.title, f"todos[{index}].title", MAX_TITLE)
        if title is None:
            raise _Refused(f"todos[{index}].title is empty")
        description = _trimmed(todo.description, f"todos[{index}].description", MAX_DESCRIPTION)
        created.append(TodoItem(id=state.next_id + index, title=title, description=description))
    return (
        TodoState(items=[*state.items, *created], next_id=state.next_id + len(created)),
        created,
    )


def _complete(state: TodoState, args: CompleteArgs) -> tuple[TodoState, dict[str, Any]]:
    # The reason steers the model to say how the item was done; like the seed, it is not kept.
    wanted = {item.id for item in args.items}
    known = {item.id for item in state.items}
    items = [
        msgspec.structs.replace(item, done=True) if item.id in wanted and not item.done else item
        for item in state.items
    ]
    completed = sum(1 for old, new in zip(state.items, items, strict=True) if old is not new)
    outcome = {
        "completed": completed,
        "already_done": sorted(i.id for i in state.items if i.id in wanted and i.done),
        "unknown_ids": sorted(wanted - known),
    }
    return (msgspec.structs.replace(state, items=items) if completed else state), outcome


def _remove(state: TodoState, args: RemoveArgs) -> tuple[TodoState, dict[str, Any]]:
    wanted = set(args.ids)
    items = [item for item in state.items if item.id not in wanted]
    removed = len(state.items) - len(items)
    outcome = {
        "removed": removed,
        "unknown_ids": sorted(wanted - {item.id for item in state.items}),
    }
    # next_id stays: ids are never reused, even when the list is emptied.
    return (msgspec.structs.replace(state, items=items) if removed else state), outcome


def apply(state: TodoState, call: FunctionCallContent) -> tuple[TodoState, FunctionResultContent]:
    """Run one todo tool call against `state`: the new state (the same object when nothing
    changed) and the result the model reads. Wrong argument shapes, empty titles and unknown
    tool names are error results, never exceptions."""
    try:
        match call.name:
            case "todos_add":
                state, created = _add(state, _arguments(call, AddArgs))
                result: Any = msgspec.to_builtins(created)
            case "todos_complete":
                state, result = _complete(state, _arguments(call, CompleteArgs))
            case "todos_remove":
                state, result = _remove(state, _arguments(call, RemoveArgs))
            case "todos_get_remaining":
                _arguments(call, NoArgs)
                result = msgspec.to_builtins(state.open_items)
            case "todos_get_all":
                _arguments(call, NoArgs)
                result = msgspec.to_builtins(state.items)
            case _:
                raise _Refused(f"no todo tool named {call.name[:64]!r}")
    except _Refused as exc:
        return state, FunctionResultContent(call_id=call.call_id, error=f"{call.name}: {exc}")
    return state, FunctionResultContent(call_id=call.call_id, result=result)


def _arguments(call: FunctionCallContent, kind: type[A]) -> A:
    try:
        return msgspec.convert(call.arguments, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise _Refused(f"invalid arguments: {exc}") from None


def context_message(state: TodoState, fmt: TodoListFormat = DEFAULT_FORMAT) -> ChatMessage:
    """The per-turn message that reads the list to the model: a user message stamped
    `context_provider`, so history never stores it."""
    return ChatMessage(
        role="user",
        contents=[TextContent(text=render(state.items, fmt))],
        message_id="todos",
        source="context_provider",
    )
