"""The harness as the run loop sees it: the `[harness]` table, the tools it runs itself, what it
adds to the prompt and where, and the refusal before any model call."""

import ast
import tomllib
from pathlib import Path

import msgspec
import pytest

from runbus import modes as stored_modes
from runbus.headers import RunContext
from runbus.messages import ChatMessage, FunctionCallContent, FunctionResultContent, TextContent
from runbus_gateway.agents import load_agents
from runbus_gateway.errors import GatewayConfigError
from runbus_gateway.harness import Harness, HarnessConfig, SessionState, with_context
from runbus_gateway.harness.errors import StateInvalid
from tests.unit.test_harness_state import SessionStore
from tests.unit.test_import_cycles import imported, modules

CTX = RunContext(run_id="r-1", session_id="s1", agent="travel")

FULL = """
[harness]
guardrails = [
  {name = "blocked_terms", terms = ["wire the money"]},
  {name = "pii", kinds = ["password"]},
]
rewriters = [{name = "disclaimer", text = "Prices change; check before you book."}]
errors = {messages = {model_error = "The assistant is busy."}}

[harness.todos]
enabled = true
format = {empty = "- nothing yet"}

[harness.modes]
enabled = true

[harness.loop]
enabled = true
max_loop_iterations = 4
evaluators = [{name = "todos_open", only_in_execute = true}]
"""


class Agent(msgspec.Struct, forbid_unknown_fields=True):
    """Stands in for the gateway's AgentSpec: the table is decoded the same way."""

    harness: HarnessConfig = HarnessConfig()


def decode(text: str) -> HarnessConfig:
    return msgspec.convert(tomllib.loads(text), Agent).harness


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", contents=[TextContent(text=text)])


def calls(*call_ids: str) -> ChatMessage:
    return ChatMessage(
        role="assistant",
        contents=[FunctionCallContent(call_id=c, name="get_weather") for c in call_ids],
    )


def results(*call_ids: str) -> ChatMessage:
    return ChatMessage(
        role="tool", contents=[FunctionResultContent(call_id=c, result="sunny") for c in call_ids]
    )


def test_an_agent_without_a_harness_table_gets_nothing_new() -> None:
    harness = Harness.from_config(decode(""))

    assert harness.tools == []
    assert harness.instructions({}) == ""
    assert harness.todo_message({}) is None
    assert harness.mode_notice({}) is None
    assert harness.refuse([user("my password is hunter22")]) is None
    assert harness.program is None


def test_a_full_harness_table_decodes_into_a_working_harness() -> None:
    harness = Harness.from_config(decode(FULL))

    assert [t.name for t in harness.tools] == [
        "todos_add",
        "todos_complete",
        "todos_remove",
        "todos_get_remaining",
        "todos_get_all",
        "mode_get",
        "mode_set",
    ]
    assert harness.handles("todos_add")
    assert not harness.handles("get_weather")
    refusal = harness.refuse([user("Please wire the money")])
    assert refusal is not None
    assert refusal.guardrail == "blocked_terms"
    message = harness.todo_message({})
    assert message is not None
    assert message.text == "### Current todo list\n- nothing yet"
    assert "## Todo list" in harness.instructions({})
    assert harness.instructions({}).rstrip().endswith("You are in plan mode now.")
    assert harness.user_error(RuntimeError("boom")).message != "boom"


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ('guardrails = [{name = "profanity"}]', "unknown guardrail 'profanity'"),
        ('rewriters = [{name = "footer"}]', "unknown output rewriter 'footer'"),
        ("todos = {enabld = true}", "unknown field `enabld`"),
        ('kind = "program"', "needs `program"),
        ('program = "a.b:C"', "harness kind is 'chat'"),
        ('kind = "program"\nprogram = "no such thing"', "is not `module:Name`"),
        ('kind = "program"\nprogram = "runbus_nowhere:X"', "cannot import 'runbus_nowhere'"),
        ('kind = "program"\nprogram = "json:Nope"', "has no class 'Nope'"),
        ('kind = "program"\nprogram = "json:JSONDecoder"', "no `async def respond(run)`"),
        ("loop = {enabled = true}", "'todos_open' needs todos.enabled"),
        ("loop = {enabled = true, max_loop_iterations = 0}", "Expected `int` >= 1"),
    ],
)
def test_a_bad_harness_table_fails_the_agent_file_naming_the_problem(
    table: str, complaint: str, tmp_path: Path
) -> None:
    (tmp_path / "bad.toml").write_text(f'name = "bad"\nmodel = "offline"\n[harness]\n{table}\n')

    with pytest.raises(GatewayConfigError) as raised:
        load_agents(tmp_path)

    assert complaint in str(raised.value)
    assert "$.harness" in str(raised.value)


def test_a_harness_tool_name_in_the_agents_own_tools_is_refused() -> None:
    harness = Harness.from_config(decode(FULL))

    with pytest.raises(GatewayConfigError, match=r"\['todos_add'\]"):
        harness.check_tool_names(["get_weather", "todos_add"])


async def test_todo_and_mode_tools_run_against_the_state_bag() -> None:
    harness = Harness.from_config(decode(FULL))
    store = SessionStore()
    state = SessionState(store, CTX, store.record)

    added = await harness.call_tool(
        state,
        FunctionCallContent(
            call_id="c1", name="todos_add", arguments={"todos": [{"title": "Book hotel"}]}
        ),
    )
    switched = await harness.call_tool(
        state, FunctionCallContent(call_id="c2", name="mode_set", arguments={"mode": "execute"})
    )

    assert added.result[0]["id"] == 1
    assert switched.result == "mode is now 'execute'"
    assert store.record.state["mode"] == {"mode": "execute", "changed_from": None}
    message = harness.todo_message(state.bag)
    assert message is not None
    assert message.text == "### Current todo list\n- 1 [open] Book hotel"
    assert harness.instructions(state.bag).rstrip().endswith("You are in execute mode now.")


async def test_a_tool_of_a_disabled_part_is_an_error_result() -> None:
    harness = Harness.from_config(decode("[harness]\ntodos = {enabled = true}\n"))
    store = SessionStore()

    result = await harness.call_tool(
        SessionState(store, CTX, store.record),
        FunctionCallContent(call_id="c1", name="mode_set", arguments={"mode": "execute"}),
    )

    assert result.error == "no tool named 'mode_set' is available"
    assert store.writes == 0


async def test_a_host_mode_switch_is_announced_then_acknowledged_in_the_state_bag() -> None:
    harness = Harness.from_config(decode(FULL))
    store = SessionStore()
    switched = stored_modes.host_set(stored_modes.ModeState(mode="plan"), "execute")
    store.put("mode", stored_modes.dump(switched))
    state = SessionState(store, CTX, store.record)

    notice = harness.mode_notice(state.bag)
    await harness.acknowledge_mode(state)

    assert notice is not None
    assert "from 'plan' to 'execute'" in notice.text
    assert harness.mode_notice(state.bag) is None
    assert store.record.state["mode"] == {"mode": "execute", "changed_from": None}


def test_an_unreadable_state_value_is_a_typed_error_naming_the_key() -> None:
    harness = Harness.from_config(decode(FULL))

    with pytest.raises(StateInvalid, match="state 'todos'"):
        harness.todo_message({"todos": "shopping"})
    with pytest.raises(StateInvalid, match="state 'mode'"):
        harness.instructions({"mode": {"mode": "yolo"}})


def test_the_final_answer_gets_the_disclaimer_and_the_text_to_stream() -> None:
    harness = Harness.from_config(decode(FULL))
    answer = ChatMessage(role="assistant", contents=[TextContent(text="QF401 is A$199.")])

    rewritten, added = harness.rewrite(answer)

    assert rewritten.text == "QF401 is A$199.\n\nPrices change; check before you book."
    assert added == "\n\nPrices change; check before you book."


TODO = ChatMessage(role="user", contents=[TextContent(text="### Current todo list")])


def shape(messages: list[ChatMessage]) -> list[str]:
    return [m.role if m is not TODO else "TODO" for m in messages]


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        ([], ["TODO"]),
        ([user("hi")], ["user", "TODO"]),
        ([user("hi"), calls("a"), results("a")], ["user", "assistant", "tool", "TODO"]),
        # An open group at the end (a call still without its result): before the group.
        ([user("hi"), calls("a")], ["user", "TODO", "assistant"]),
        ([user("hi"), calls("a", "b"), results("a")], ["user", "TODO", "assistant", "tool"]),
        (
            [user("hi"), calls("a"), results("a"), calls("b")],
            ["user", "assistant", "tool", "TODO", "assistant"],
        ),
    ],
)
def test_context_messages_never_land_inside_an_open_tool_call_group(
    view: list[ChatMessage], expected: list[str]
) -> None:
    assert shape(with_context(view, [TODO])) == expected


def test_no_context_messages_leave_the_view_as_it_is() -> None:
    view = [user("hi"), calls("a")]

    assert with_context(view, []) == view


NATS_SIDE = {"runbus.bus", "runbus.service", "runbus.consumer", "runbus.jetstream"}


def imports_nats(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] == "nats" for name in names):
            return True
    return False


def test_neither_the_harness_nor_the_run_reaches_nats_by_any_import() -> None:
    known = modules()
    reached: set[str] = set()
    todo = [n for n in known if n.startswith(("runbus_gateway.harness", "runbus_gateway.run."))]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(imported(name, known[name], known))

    assert "runbus_gateway.run.execute" in reached
    assert sorted(reached & NATS_SIDE) == []
    assert [name for name in sorted(reached) if imports_nats(known[name])] == []
