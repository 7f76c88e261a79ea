"""The todo list as it lives in a session's state bag (key `todos`), and its text form.

The gateway's harness owns the list (its tools change it, with compare-and-set); clients read it
from the session record without a model call (`runbus todos`, the console's `/todos`). Both
sides use this module, so the stored shape and the rendered text are defined once.
"""

import string
from collections.abc import Sequence
from typing import Any, Final

import msgspec

STATE_KEY: Final = "todos"
"""Key of the todo list in the session state bag."""


class TodoItem(msgspec.Struct, kw_only=True, frozen=True):
    id: int
    """Unique in its session, from 1; never reused, even after the item is removed."""
    title: str
    """What to do, trimmed."""
    description: str | None = None
    """Optional detail, trimmed; None when blank."""
    done: bool = False
    """Marked complete (the reason the model gave is not kept)."""


class TodoState(msgspec.Struct, kw_only=True, frozen=True):
    """The stored value. Unknown fields are ignored, so an older gateway reads a newer list."""

    items: list[TodoItem] = []
    """Items in the order they were added."""
    next_id: int = 1
    """Id the next added item gets; only ever grows."""

    @property
    def open_items(self) -> list[TodoItem]:
        return [item for item in self.items if not item.done]


def load(value: Any) -> TodoState:
    """The list stored under `STATE_KEY` (None: a session that has none yet).

    Raises `msgspec.ValidationError` when the stored value is not a todo list.
    """
    if value is None:
        return TodoState()
    return msgspec.convert(value, TodoState)


def dump(state: TodoState) -> dict[str, Any]:
    """The JSON value to store under `STATE_KEY`."""
    value: dict[str, Any] = msgspec.to_builtins(state)
    return value


FORMAT_FIELDS: Final = frozenset({"id", "status", "title", "description"})
"""Placeholders an item line may use; `status` is `open` or `done`."""


class TodoListFormat(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How the list reads as text. The defaults give the seed's format:

    ### Current todo list
    - 1 [open] Compare prices: economy only
    - 2 [done] Check the weather
    """

    header: str = "### Current todo list"
    """First line."""
    item: str = "- {id} [{status}] {title}: {description}"
    """One line per item that has a description."""
    item_without_description: str = "- {id} [{status}] {title}"
    """One line per item without one."""
    empty: str = "- none yet"
    """The line under the header when the list is empty."""

    def __post_init__(self) -> None:
        for template in (self.item, self.item_without_description, self.empty):
            for _, field, spec, conversion in string.Formatter().parse(template):
                if field is None:
                    continue
                if field not in FORMAT_FIELDS or spec or conversion:
                    raise ValueError(
                        f"todo list format {template!r} uses {{{field}}}; "
                        f"allowed: {', '.join(sorted(FORMAT_FIELDS))} (no conversions or specs)"
                    )


DEFAULT_FORMAT: Final = TodoListFormat()


def render_item(item: TodoItem, fmt: TodoListFormat = DEFAULT_FORMAT) -> str:
    description = (item.description or "").strip()
    template = fmt.item if description else fmt.item_without_description
    return template.format(
        id=item.id,
        status="done" if item.done else "open",
        title=item.title,
        description=description,
    )


def render(items: Sequence[TodoItem], fmt: TodoListFormat = DEFAULT_FORMAT) -> str:
    """The list as the per-turn message shows it: the header, then one line per item (or the
    `empty` line); no trailing newline."""
    lines = [render_item(item, fmt) for item in items] or [fmt.empty]
    return "\n".join([fmt.header, *lines])
