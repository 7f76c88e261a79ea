"""`runbus usage`: model tokens and cost for one UTC day, per tenant, user, agent, route and
model, with each tenant's budget; `--json` prints the `model.usage_report` as it came."""

import argparse
import re
from collections.abc import Sequence

import msgspec
from opentelemetry import trace

from .. import ops
from ..bus import Bus
from ..headers import RunContext
from ..messages.model import ModelUsageQuery, ModelUsageReport
from ..settings import Settings
from ._common import Subparsers, connected

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}\Z")


def _day(value: str) -> str:
    if not _DAY.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a day like 2026-03-04")
    return value


def register(subparsers: Subparsers) -> None:
    usage = subparsers.add_parser(
        "usage", help="model tokens and cost per tenant, user, agent, route and model"
    )
    usage.add_argument("--day", type=_day, default=None, help="UTC day (default: today)")
    usage.add_argument("--tenant", default="", help="only this tenant")
    usage.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the report (default 10)"
    )
    usage.add_argument("--json", action="store_true", help="one JSON document")
    usage.set_defaults(handler=handle)


async def handle(settings: Settings, args: argparse.Namespace) -> int:
    query = ModelUsageQuery(day=args.day or "", tenant=args.tenant)
    async with connected(settings, operator=True) as nc:
        bus = Bus(nc, trace.get_tracer("runbus.cli"), request_timeout=args.timeout)
        report = await bus.call(ops.MODEL_USAGE, query, ctx=RunContext())
    print(msgspec.json.encode(report).decode() if args.json else render(report))
    return 0


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *map(line, rows)]


def _budget(used: float, limit: float | None) -> str:
    if limit is None:
        return "-"
    share = f" ({100 * used / limit:.0f}%)" if limit else ""
    shown = str(limit) if isinstance(limit, int) else f"{limit:.2f}"
    return f"{shown}{share}"


def render(report: ModelUsageReport) -> str:
    """Two tables for a person: tenants against their budgets, then the breakdown."""
    title = f"Model usage on {report.day} (UTC), costs in {report.currency}"
    if not report.rows:
        return f"{title}\nno model calls"
    tenants = []
    for t in report.tenants:
        tokens = t.input_tokens + t.output_tokens
        tenants.append(
            (
                t.tenant,
                str(t.calls),
                str(tokens),
                _budget(tokens, t.tokens_per_day),
                f"{t.cost:.6f}",
                _budget(t.cost, t.cost_per_day),
            )
        )
    rows = [
        (
            r.tenant,
            r.user_id,
            r.agent,
            r.route,
            r.model,
            str(r.calls),
            str(r.input_tokens),
            str(r.output_tokens),
            f"{r.cost:.6f}",
        )
        for r in report.rows
    ]
    return "\n".join(
        [
            title,
            *_table(
                ("TENANT", "CALLS", "TOKENS", "TOKEN BUDGET", "COST", "COST BUDGET"),
                tenants,
                {1, 2, 3, 4, 5},
            ),
            "",
            *_table(
                ("TENANT", "USER", "AGENT", "ROUTE", "MODEL", "CALLS", "IN", "OUT", "COST"),
                rows,
                {5, 6, 7, 8},
            ),
        ]
    )
