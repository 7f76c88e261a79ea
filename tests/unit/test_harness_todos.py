"""The todo list of seed 000 (MAF's TodoProvider): tools, ids, counts, the stored shape and the
per-turn `### Current todo list` message."""

from typing import Any

import jsonschema
import msgspec
import pytest

from runbus import todos as stored
from runbus.messages import FunctionCallContent, FunctionResultContent
from runbus.todos import TodoItem, TodoListFormat, TodoState, render
from runbus_gateway.harness import todos


def call(name: str, **arguments: Any) -> FunctionCallContent:
    return FunctionCallContent(call_id=f"c-{name}", name=name, arguments=arguments)


def run(state: TodoState, name: str, **arguments: Any) -> tuple[TodoState, FunctionResultContent]:
    return todos.apply(state, call(name, **arguments))


def listed(*titles: str) -> TodoState:
    state, _ = run(TodoState(), "todos_add", todos=[{"title": t} for t in titles])
    return state


def test_the_model_gets_exactly_the_five_todo_tools_with_valid_schemas() -> None:
    assert [spec.name for spec in todos.TOOL_SPECS] == [
        "todos_add",
        "todos_complete",
        "todos_remove",
        "todos_get_remaining",
        "todos_get_all",
    ]
    for spec in todos.TOOL_SPECS:
        jsonschema.Draft202012Validator.check_schema(spec.parameters)
    add, complete, remove, remaining, _everything = (s.parameters for s in todos.TOOL_SPECS)
    jsonschema.validate({"todos": [{"title": "a"}, {"title": "b", "description": "c"}]}, add)
    jsonschema.validate({"items": [{"id": 1, "reason": "done"}]}, complete)
    jsonschema.validate({"ids": [1, 2]}, remove)
    jsonschema.validate({}, remaining)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"items": [{"id": 1}]}, complete)


def test_added_items_get_ids_from_one_with_trimmed_titles_and_descriptions() -> None:
    state, result = run(
        TodoState(),
        "todos_add",
        todos=[
            {"title": "  Compare flights  ", "description": "  economy only \n"},
            {"title": "Check the weather", "description": "   "},
        ],
    )

    assert result.error is None
    assert result.result == [
        {"id": 1, "title": "Compare flights", "description": "economy only", "done": False},
        {"id": 2, "title": "Check the weather", "description": None, "done": False},
    ]
    assert state.next_id == 3
    assert [item.id for item in state.items] == [1, 2]


def test_ids_are_never_reused_even_after_the_list_is_emptied() -> None:
    state = listed("a", "b", "c")
    state, removed = run(state, "todos_remove", ids=[1, 2, 3])
    assert removed.result == {"removed": 3, "unknown_ids": []}
    assert state.items == []
    assert state.next_id == 4

    state, result = run(state, "todos_add", todos=[{"title": "d"}])

    assert result.result[0]["id"] == 4


def test_complete_counts_only_open_items_reports_unknown_ids_and_does_not_store_the_reason() -> (
    None
):
    state = listed("a", "b", "c")
    state, first = run(state, "todos_complete", items=[{"id": 2, "reason": "found a flight"}])
    assert first.result == {"completed": 1, "already_done": [], "unknown_ids": []}

    state, second = run(
        state,
        "todos_complete",
        items=[{"id": 2, "reason": "again"}, {"id": 3, "reason": "ok"}, {"id": 9, "reason": "?"}],
    )

    assert second.result == {"completed": 1, "already_done": [2], "unknown_ids": [9]}
    assert [item.done for item in state.items] == [False, True, True]
    assert "reason" not in msgspec.json.encode(stored.dump(state)).decode()
    assert "found a flight" not in msgspec.json.encode(stored.dump(state)).decode()


def test_a_call_that_changes_nothing_returns_the_same_state() -> None:
    state = listed("a")

    after_unknown, result = run(state, "todos_complete", items=[{"id": 7, "reason": "x"}])
    after_remove, _ = run(state, "todos_remove", ids=[7])

    assert result.result == {"completed": 0, "already_done": [], "unknown_ids": [7]}
    assert after_unknown is state
    assert after_remove is state


def test_remove_counts_what_it_removed_and_reports_unknown_ids() -> None:
    state = listed("a", "b")

    state, result = run(state, "todos_remove", ids=[2, 2, 5])

    assert result.result == {"removed": 1, "unknown_ids": [5]}
    assert [item.title for item in state.items] == ["a"]


def test_remaining_lists_open_items_and_all_lists_every_item() -> None:
    state = listed("a", "b")
    state, _ = run(state, "todos_complete", items=[{"id": 1, "reason": "done"}])

    _, remaining = run(state, "todos_get_remaining")
    _, everything = run(state, "todos_get_all")

    assert [item["id"] for item in remaining.result] == [2]
    assert [(item["id"], item["done"]) for item in everything.result] == [(1, True), (2, False)]


@pytest.mark.parametrize(
    ("name", "arguments", "complaint"),
    [
        ("todos_add", {"todos": "buy milk"}, "Expected `array`, got `str`"),
        ("todos_add", {"todos": []}, "at `$.todos`"),
        ("todos_add", {"todos": [{"title": "   "}]}, "todos[0].title is empty"),
        ("todos_add", {"todos": [{"title": "x" * 201}]}, "at most 200"),
        ("todos_add", {"todos": [{"name": "x"}]}, "unknown field `name`"),
        ("todos_complete", {"items": [{"id": 1}]}, "missing required field `reason`"),
        ("todos_complete", {"ids": [1]}, "unknown field `ids`"),
        ("todos_remove", {"ids": ["first"]}, "Expected `int`"),
        ("todos_remove", {}, "missing required field `ids`"),
        ("todos_get_all", {"verbose": True}, "unknown field `verbose`"),
        ("todos_clear", {}, "no todo tool named 'todos_clear'"),
    ],
)
def test_wrong_shapes_are_error_results_the_model_can_read_and_change_nothing(
    name: str, arguments: dict[str, Any], complaint: str
) -> None:
    state = listed("a")

    after, result = todos.apply(state, call(name, **arguments))

    assert after is state
    assert result.result is None
    assert result.error is not None
    assert result.error.startswith(f"{name}: ")
    assert complaint in result.error
    assert result.call_id == f"c-{name}"


def test_ids_written_as_strings_are_understood() -> None:
    state = listed("a", "b")

    _, result = run(state, "todos_remove", ids=["2"])

    assert result.result == {"removed": 1, "unknown_ids": []}


def test_the_list_never_grows_past_its_limit() -> None:
    state = listed(*(f"item {n}" for n in range(todos.MAX_ITEMS)))

    after, result = run(state, "todos_add", todos=[{"title": "one more"}])

    assert after is state
    assert result.error is not None
    assert "at most 100 items" in result.error


def test_the_injected_message_reads_like_the_seed() -> None:
    state = listed("Compare flights", "Check the weather")
    state, _ = run(
        state, "todos_add", todos=[{"title": "Book hotel", "description": "near the venue"}]
    )
    state, _ = run(state, "todos_complete", items=[{"id": 2, "reason": "sunny"}])

    message = todos.context_message(state)

    assert message.role == "user"
    assert message.source == "context_provider"
    assert message.text == (
        "### Current todo list\n"
        "- 1 [open] Compare flights\n"
        "- 2 [done] Check the weather\n"
        "- 3 [open] Book hotel: near the venue"
    )


def test_an_empty_list_reads_none_yet() -> None:
    assert todos.context_message(TodoState()).text == "### Current todo list\n- none yet"


def test_the_list_message_format_can_be_replaced() -> None:
    fmt = TodoListFormat(
        header="Plan:",
        item="* #{id} {title} ({status}) - {description}",
        item_without_description="* #{id} {title} ({status})",
        empty="(nothing planned)",
    )
    items = [TodoItem(id=1, title="a", description="b"), TodoItem(id=2, title="c", done=True)]

    assert render(items, fmt) == "Plan:\n* #1 a (open) - b\n* #2 c (done)"
    assert render([], fmt) == "Plan:\n(nothing planned)"


@pytest.mark.parametrize("template", ["- {id} {owner}", "- {title.upper}", "- {id!r}", "{id:>4}"])
def test_a_list_format_with_unknown_placeholders_is_refused(template: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="allowed: description, id, status, title"):
        msgspec.convert({"item": template}, TodoListFormat)


def test_the_stored_list_round_trips_through_json_and_ignores_unknown_fields() -> None:
    state = listed("a", "b")
    raw = msgspec.json.decode(msgspec.json.encode(stored.dump(state)))

    assert raw == {
        "items": [
            {"id": 1, "title": "a", "description": None, "done": False},
            {"id": 2, "title": "b", "description": None, "done": False},
        ],
        "next_id": 3,
    }
    assert stored.load(raw) == state
    assert stored.load({**raw, "owner": "a newer gateway"}) == state
    assert stored.load(None) == TodoState()
    with pytest.raises(msgspec.ValidationError):
        stored.load({"items": "none"})
