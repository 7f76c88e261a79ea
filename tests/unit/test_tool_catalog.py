"""What `runbus.tools.list` answers from a replica's own tools: only what the run's tenant and
agent may use, in the order asked for."""

from runbus.headers import RunContext
from runbus_tool_executor.catalog import select
from runbus_tool_executor.registry import ToolRegistry

registry = ToolRegistry()


@registry.tool()
def weather(city: str) -> str:
    """Weather."""
    return city


@registry.tool(tenants=["acme"])
def expenses() -> str:
    """Acme's expense system."""
    return ""


@registry.tool(agents=["finance"])
def ledger() -> str:
    """Only the finance agent."""
    return ""


ACME_TRAVEL = RunContext(agent="travel", props={"tenant": "acme"})
GLOBEX_FINANCE = RunContext(agent="finance", props={"tenant": "globex"})


async def names(requested: list[str] | None, ctx: RunContext) -> list[str]:
    return [spec.name for spec in await select(registry.tools, None, requested, ctx)]


async def test_all_tools_are_listed_by_name_when_none_are_asked_for() -> None:
    assert await names(None, ACME_TRAVEL) == ["expenses", "weather"]
    assert await names(None, GLOBEX_FINANCE) == ["ledger", "weather"]


async def test_the_agents_list_keeps_its_order_and_drops_what_is_not_there() -> None:
    assert await names(["weather", "nope", "expenses", "weather"], ACME_TRAVEL) == [
        "weather",
        "expenses",
    ]


async def test_a_tool_of_another_tenant_or_agent_is_not_listed_even_when_asked_for() -> None:
    assert await names(["expenses", "ledger"], GLOBEX_FINANCE) == ["ledger"]
    assert await names(["expenses", "ledger"], ACME_TRAVEL) == ["expenses"]
    assert await names(["expenses"], RunContext()) == []
