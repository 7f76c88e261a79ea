"""Tools from typed functions: the schema the model sees, and calls that never raise."""

import asyncio
from typing import Annotated, Any, Literal

import msgspec
import pytest

from runbus.headers import RunContext
from runbus.messages import FunctionResultContent
from runbus_tool_executor.errors import ToolDefinitionError
from runbus_tool_executor.registry import MAX_RESULT_BYTES, FromProp, ToolContext, ToolRegistry

CTX = RunContext(
    run_id="r-1",
    session_id="s1",
    agent="travel",
    props={"user_id": "alice", "tenant": "acme"},
)

registry = ToolRegistry()
seen: dict[str, Any] = {}


@registry.tool(side_effect=True)
def transfer(
    amount: Annotated[int, msgspec.Meta(ge=1, le=1000)],
    account: Annotated[str, FromProp("user_id")],
    context: ToolContext,
    currency: Literal["AUD", "USD"] = "AUD",
    memo: Annotated[str, msgspec.Meta(max_length=20)] = "",
) -> dict[str, Any]:
    """Move money from the signed-in user's account."""
    seen["context"] = context
    return {"amount": amount, "account": account, "currency": currency, "memo": memo}


@registry.tool(name="echo-async", description="Echo, asynchronously.")
async def echo(text: str) -> str:
    await asyncio.sleep(0)
    return text


@registry.tool()
def explode(reason: str) -> None:
    """Always fails."""
    raise RuntimeError(reason)


@registry.tool(timeout=0.05)
async def stall() -> str:
    """Never finishes in time."""
    await asyncio.Event().wait()
    return "too late"


@registry.tool()
def flood(size: int) -> str:
    """Returns `size` bytes."""
    return "x" * size


@registry.tool()
def opaque() -> object:
    """Returns something that is not JSON."""
    return object()


async def invoke(name: str, arguments: dict[str, Any], ctx: RunContext = CTX) -> Any:
    result = await registry.tools[name].invoke("call-1", arguments, ctx)
    assert isinstance(result, FunctionResultContent)
    assert result.call_id == "call-1"
    return result


def test_the_schema_shows_only_what_the_model_may_choose() -> None:
    schema = registry.tools["transfer"].spec().parameters

    assert set(schema["properties"]) == {"amount", "currency", "memo"}
    assert schema["required"] == ["amount"]
    assert schema["additionalProperties"] is False
    assert schema["type"] == "object"


def test_the_schema_carries_the_parameters_constraints_and_defaults() -> None:
    properties = registry.tools["transfer"].spec().parameters["properties"]

    assert properties["amount"] == {"type": "integer", "minimum": 1, "maximum": 1000}
    assert properties["currency"] == {"enum": ["AUD", "USD"], "default": "AUD"}
    assert properties["memo"]["maxLength"] == 20


def test_the_docstring_is_the_description_unless_one_is_given() -> None:
    assert registry.tools["transfer"].spec().description == (
        "Move money from the signed-in user's account."
    )
    assert registry.tools["echo-async"].spec().description == "Echo, asynchronously."
    assert registry.tools["transfer"].side_effect
    assert not registry.tools["echo-async"].side_effect


async def test_valid_arguments_reach_the_tool_with_the_trusted_identity() -> None:
    result = await invoke("transfer", {"amount": 5, "currency": "USD"})

    assert result.error is None
    assert result.result == {"amount": 5, "account": "alice", "currency": "USD", "memo": ""}


async def test_the_tool_context_describes_the_run_it_serves() -> None:
    await invoke("transfer", {"amount": 5})

    assert seen["context"] == ToolContext(
        run_id="r-1",
        session_id="s1",
        agent="travel",
        props={"user_id": "alice", "tenant": "acme"},
        call_id="call-1",
    )


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({}, "amount"),
        ({"amount": 0}, "amount"),
        ({"amount": "5"}, "amount"),
        ({"amount": 5, "currency": "EUR"}, "currency"),
        ({"amount": 5, "memo": "x" * 21}, "memo"),
        ({"amount": 5, "to": "mallory"}, "to"),
    ],
    ids=["missing", "too-small", "wrong-type", "not-allowed", "too-long", "unknown"],
)
async def test_invalid_arguments_become_an_error_result_naming_the_field(
    arguments: dict[str, Any], field: str
) -> None:
    seen.pop("context", None)

    result = await invoke("transfer", arguments)

    assert result.result is None
    assert result.error.startswith("invalid arguments")
    assert field in result.error
    assert "context" not in seen


async def test_an_identity_argument_from_the_model_is_discarded_for_the_trusted_one() -> None:
    result = await invoke("transfer", {"amount": 5, "account": "mallory"})

    assert result.error is None
    assert result.result["account"] == "alice"


async def test_a_tool_needing_an_identity_the_run_lacks_gets_an_error_result() -> None:
    anonymous = RunContext(run_id="r-1", props={"tenant": "acme"})

    result = await invoke("transfer", {"amount": 5, "account": "mallory"}, anonymous)

    assert result.result is None
    assert "user_id" in result.error


async def test_a_tool_that_raises_becomes_an_error_result_the_model_can_read() -> None:
    result = await invoke("explode", {"reason": "disk full"})

    assert result.error == "tool 'explode' failed: RuntimeError: disk full"


async def test_a_tool_that_runs_past_its_timeout_becomes_an_error_result() -> None:
    result = await invoke("stall", {})

    assert result.result is None
    assert "timed out" in result.error


async def test_a_result_over_the_size_cap_becomes_an_error_result() -> None:
    result = await invoke("flood", {"size": MAX_RESULT_BYTES + 1})

    assert result.result is None
    assert str(MAX_RESULT_BYTES) in result.error


async def test_a_result_just_under_the_size_cap_is_returned() -> None:
    result = await invoke("flood", {"size": MAX_RESULT_BYTES - 2})

    assert result.error is None
    assert len(result.result) == MAX_RESULT_BYTES - 2


async def test_a_result_that_is_not_json_becomes_an_error_result() -> None:
    result = await invoke("opaque", {})

    assert result.result is None
    assert "opaque" in result.error


async def test_sync_and_async_tools_both_answer() -> None:
    assert (await invoke("echo-async", {"text": "hi"})).result == "hi"
    assert (await invoke("flood", {"size": 3})).result == "xxx"


def test_registering_a_second_tool_of_the_same_name_is_refused() -> None:
    again = ToolRegistry()

    @again.tool()
    def lookup(q: str) -> str:
        return q

    with pytest.raises(ToolDefinitionError, match="'lookup'"):

        @again.tool(name="lookup")
        def other(q: str) -> str:
            return q


@pytest.mark.parametrize("name", ["a.b", "x>", "has space", "x" * 65, "a\n"])
def test_a_tool_name_unsafe_in_a_subject_is_refused(name: str) -> None:
    with pytest.raises(ToolDefinitionError, match="tool name"):

        @ToolRegistry().tool(name=name)
        def lookup(q: str) -> str:
            return q


def test_a_parameter_without_a_type_is_refused() -> None:
    with pytest.raises(ToolDefinitionError, match="'q'"):

        @ToolRegistry().tool()
        def lookup(q) -> str:  # type: ignore[no-untyped-def]
            return str(q)
