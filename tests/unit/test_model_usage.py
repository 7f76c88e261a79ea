"""Usage, cost and budgets: prices from config, daily totals per tenant, refusal before the call."""

import pytest

from runbus.headers import RunContext
from runbus.messages.model import UsageRow
from runbus_model_router.config import TargetConfig, parse_config
from runbus_model_router.errors import BudgetExceeded
from runbus_model_router.usage import Labels, MemoryLedger, check_budget, price, report, row

CONFIG = parse_config(
    """
currency = "EUR"
[budgets."*"]
tokens_per_day = 1000
[budgets.acme]
cost_per_day = 0.5
[budgets.free]
"""
)
DAY = "2026-03-04"


def usage(tenant: str, input_tokens: int, output_tokens: int, cost: float = 0.0) -> UsageRow:
    labels = Labels(tenant, "alice", "travel", "cheap", "small")
    return row(labels, input_tokens, output_tokens, cost)


def test_cost_is_tokens_times_the_price_per_million() -> None:
    target = TargetConfig(backend="x", model="m", input_price=0.15, output_price=0.60)

    assert price(target, 1_000_000, 0) == pytest.approx(0.15)
    assert price(target, 2000, 1000) == pytest.approx((2000 * 0.15 + 1000 * 0.60) / 1e6)


def test_a_call_is_attributed_from_the_trusted_run_context() -> None:
    ctx = RunContext(run_id="r", agent="travel", props={"tenant": "acme", "user_id": "bob"})

    assert Labels.of(ctx, "cheap", "small") == Labels("acme", "bob", "travel", "cheap", "small")
    assert Labels.of(RunContext(), "offline", "offline") == Labels(
        "-", "-", "-", "offline", "offline"
    )


async def test_a_tenant_within_its_token_budget_may_call() -> None:
    ledger = MemoryLedger()
    ledger.record(DAY, usage("globex", 500, 100))

    await check_budget(CONFIG, ledger, DAY, "globex", estimated_tokens=300, estimated_cost=0)


async def test_a_call_that_would_overspend_the_token_budget_is_refused_before_it_is_made() -> None:
    ledger = MemoryLedger()
    ledger.record(DAY, usage("globex", 800, 100))

    with pytest.raises(BudgetExceeded) as raised:
        await check_budget(CONFIG, ledger, DAY, "globex", estimated_tokens=150, estimated_cost=0)

    assert raised.value.code == "budget_exceeded"
    assert (raised.value.unit, raised.value.spent, raised.value.limit) == ("tokens", 900, 1000)
    assert raised.value.details["tenant"] == "globex"


async def test_a_money_budget_counts_the_cost_of_todays_calls_only() -> None:
    ledger = MemoryLedger()
    ledger.record("2026-03-03", usage("acme", 10, 10, cost=5.0))
    ledger.record(DAY, usage("acme", 10, 10, cost=0.3))
    await check_budget(CONFIG, ledger, DAY, "acme", estimated_tokens=10**9, estimated_cost=0.1)

    ledger.record(DAY, usage("acme", 10, 10, cost=0.25))

    with pytest.raises(BudgetExceeded, match="cost"):
        await check_budget(CONFIG, ledger, DAY, "acme", estimated_tokens=1, estimated_cost=0)


async def test_a_tenant_listed_without_limits_is_not_limited() -> None:
    ledger = MemoryLedger()
    ledger.record(DAY, usage("free", 10**9, 10**9))

    await check_budget(CONFIG, ledger, DAY, "free", estimated_tokens=10**6, estimated_cost=9.0)


async def test_without_budgets_nobody_is_limited() -> None:
    ledger = MemoryLedger()
    ledger.record(DAY, usage("acme", 10**9, 10**9, cost=10**6))

    await check_budget(parse_config(""), ledger, DAY, "acme", estimated_tokens=1, estimated_cost=1)


async def test_the_report_sums_calls_per_label_and_shows_each_tenants_budget() -> None:
    ledger = MemoryLedger()
    for _ in range(2):
        ledger.record(DAY, usage("acme", 100, 10, cost=0.01))
    ledger.record(DAY, usage("globex", 7, 3))

    result = report(CONFIG, DAY, await ledger.rows(DAY, None))

    assert result.currency == "EUR"
    assert [(r.tenant, r.calls, r.input_tokens, r.output_tokens) for r in result.rows] == [
        ("acme", 2, 200, 20),
        ("globex", 1, 7, 3),
    ]
    acme, globex = result.tenants
    assert (acme.tenant, acme.calls, acme.cost, acme.cost_per_day) == ("acme", 2, 0.02, 0.5)
    assert (globex.tokens_per_day, globex.cost_per_day) == (1000, None)
