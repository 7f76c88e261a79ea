"""Usage and cost: what one call is attributed to, what it costs, the daily totals budgets are
checked against, and the report `runbus usage` prints. The ledger interface lives here; the
JetStream KV ledger the replicas share is in `ledger.py`."""

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import msgspec

from runbus.headers import RunContext
from runbus.messages.model import ModelUsageReport, TenantUsage, UsageRow

from .config import RouterConfig, TargetConfig
from .errors import BudgetExceeded

UNKNOWN = "-"
"""Label of an attribution the run context did not carry."""


_DAY_CACHE: list[tuple[int, str]] = [(-1, "")]


def utc_day(now: datetime | None = None) -> str:
    """`YYYY-MM-DD` of `now` (default: the current UTC day)."""
    if now is not None:
        return now.astimezone(UTC).date().isoformat()
    epoch_day = int(time.time() // 86400)
    cached_day, text = _DAY_CACHE[0]
    if cached_day != epoch_day:
        text = datetime.fromtimestamp(epoch_day * 86400, UTC).date().isoformat()
        _DAY_CACHE[0] = (epoch_day, text)
    return text


def price(target: TargetConfig, input_tokens: int, output_tokens: int) -> float:
    return (input_tokens * target.input_price + output_tokens * target.output_price) / 1e6


@dataclass(frozen=True)
class Labels:
    """Who and what one call is attributed to."""

    tenant: str
    user_id: str
    agent: str
    route: str
    model: str

    @classmethod
    def of(cls, ctx: RunContext, route: str, model: str) -> "Labels":
        return cls(
            tenant=ctx.prop("tenant") or UNKNOWN,
            user_id=ctx.prop("user_id") or UNKNOWN,
            agent=ctx.agent or UNKNOWN,
            route=route,
            model=model,
        )


def row(labels: Labels, input_tokens: int, output_tokens: int, cost: float) -> UsageRow:
    return UsageRow(
        tenant=labels.tenant,
        user_id=labels.user_id,
        agent=labels.agent,
        route=labels.route,
        model=labels.model,
        calls=1,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=cost,
    )


def add_rows(a: UsageRow, b: UsageRow) -> UsageRow:
    return msgspec.structs.replace(
        a,
        calls=a.calls + b.calls,
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cost=a.cost + b.cost,
    )


def add_totals(a: TenantUsage, b: TenantUsage | UsageRow) -> TenantUsage:
    return msgspec.structs.replace(
        a,
        calls=a.calls + b.calls,
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cost=a.cost + b.cost,
    )


class UsageLedger(Protocol):
    """Where calls are counted. `record` must not block the call; `spent` may lag other
    replicas by up to one flush interval."""

    def record(self, day: str, usage: UsageRow) -> None: ...

    async def spent(self, day: str, tenant: str) -> TenantUsage: ...

    async def rows(self, day: str, tenant: str | None) -> list[UsageRow]: ...


class MemoryLedger:
    """One process's ledger, for tests and benchmarks."""

    def __init__(self) -> None:
        self.by_day: dict[str, dict[Labels, UsageRow]] = defaultdict(dict)

    def record(self, day: str, usage: UsageRow) -> None:
        labels = Labels(usage.tenant, usage.user_id, usage.agent, usage.route, usage.model)
        known = self.by_day[day].get(labels)
        self.by_day[day][labels] = add_rows(known, usage) if known else usage

    async def spent(self, day: str, tenant: str) -> TenantUsage:
        return total(tenant, (r for r in self.by_day[day].values() if r.tenant == tenant))

    async def rows(self, day: str, tenant: str | None) -> list[UsageRow]:
        return [r for r in self.by_day[day].values() if tenant is None or r.tenant == tenant]


def total(tenant: str, rows: Iterable[UsageRow]) -> TenantUsage:
    result = TenantUsage(tenant=tenant)
    for usage in rows:
        result = add_totals(result, usage)
    return result


async def check_budget(
    config: RouterConfig,
    ledger: UsageLedger,
    day: str,
    tenant: str,
    *,
    estimated_tokens: int,
    estimated_cost: float,
) -> None:
    """Refuse the call if the tenant's day is spent, or this call would overspend it."""
    budget = config.budget_for(tenant)
    if budget is None:
        return
    spent = await ledger.spent(day, tenant)
    if budget.tokens_per_day is not None:
        used = spent.input_tokens + spent.output_tokens
        if used + estimated_tokens > budget.tokens_per_day:
            raise BudgetExceeded(tenant, "tokens", used, budget.tokens_per_day, estimated_tokens)
    if budget.cost_per_day is not None and spent.cost + estimated_cost > budget.cost_per_day:
        raise BudgetExceeded(tenant, "cost", spent.cost, budget.cost_per_day, estimated_cost)


def report(config: RouterConfig, day: str, rows: list[UsageRow]) -> ModelUsageReport:
    by_tenant: dict[str, list[UsageRow]] = defaultdict(list)
    for usage in rows:
        by_tenant[usage.tenant].append(usage)
    tenants = []
    for tenant in sorted(by_tenant):
        budget = config.budget_for(tenant)
        tenants.append(
            msgspec.structs.replace(
                total(tenant, by_tenant[tenant]),
                tokens_per_day=budget.tokens_per_day if budget else None,
                cost_per_day=budget.cost_per_day if budget else None,
            )
        )
    ordered = sorted(rows, key=lambda r: (r.tenant, r.user_id, r.agent, r.route, r.model))
    return ModelUsageReport(day=day, currency=config.currency, tenants=tenants, rows=ordered)
