"""The travel package's policies: prices from the fare table, approval over A$1000, the corporate
policy that stops the loop on VA823 — and the demo's own bookings never meeting either."""

from datetime import date, timedelta
from typing import Any

import pytest

from runbus.headers import RunContext
from runbus.messages.tools import ApprovalGrant, ToolInvoke, ToolInvoked
from runbus_examples.travel import (
    APPROVAL_ABOVE_AUD,
    fare,
    ledger,
    needs_approval,
    search_flights,
    tools,
)
from runbus_tool_executor.calls import MemoryCallStore
from runbus_tool_executor.executor import Executor

ALICE = RunContext(run_id="r-travel", agent="travel", props={"user_id": "alice", "tenant": "acme"})
ROUTES = [("Melbourne", "Sydney"), ("Perth", "Darwin"), ("Sydney", "Hobart"), ("Cairns", "Tokyo")]


def executor() -> Executor:
    return Executor(middleware=tools.middleware, calls=MemoryCallStore())


async def book(
    ex: Executor,
    arguments: dict[str, Any],
    *,
    call_id: str = "c1",
    grant: ApprovalGrant | None = None,
) -> ToolInvoked:
    request = ToolInvoke(
        call_id=call_id, name="create_booking", arguments=arguments, approval=grant
    )
    return await ex.invoke(tools.tools["create_booking"], request, ALICE)


def test_no_flight_the_search_offers_is_blocked_or_needs_approval_in_economy() -> None:
    start = date(2026, 1, 1)
    for origin, destination in ROUTES:
        for day in range(366):
            for flight in search_flights(origin, destination, start + timedelta(days=day)):
                assert not flight.flight_id.startswith("VA823")
                assert flight.price_aud <= 388 < APPROVAL_ABOVE_AUD
                assert needs_approval({"flight_id": flight.flight_id}) is None


def test_a_business_fare_is_dearer_and_may_need_approval() -> None:
    flights = [
        f
        for day in range(30)
        for f in search_flights("Melbourne", "Sydney", date(2026, 3, 1) + timedelta(days=day))
    ]

    assert all(f.business_price_aud == f.price_aud * 3 + 400 for f in flights)
    dear = next(f for f in flights if f.business_price_aud > APPROVAL_ABOVE_AUD)
    reason = needs_approval({"flight_id": dear.flight_id, "cabin": "business"})
    assert reason == f"A${dear.business_price_aud} is over the A$1000 booking limit"


def test_the_price_comes_from_the_fare_table_not_from_the_model() -> None:
    assert fare("QF431-20260310") == fare("QF431-20260310")
    assert "price_aud" not in tools.tools["create_booking"].spec().parameters["properties"]


async def test_the_model_cannot_choose_who_the_booking_is_for() -> None:
    reply = await book(executor(), {"flight_id": "QF431-20260310", "user_id": "someone-else"})

    assert reply.result.result["passenger"] == "alice"
    assert "user_id" not in tools.tools["create_booking"].spec().parameters["properties"]


async def test_an_economy_booking_goes_through_with_its_price() -> None:
    before = ledger.count("r-travel")

    reply = await book(executor(), {"flight_id": "QF431-20260310"})

    assert reply.outcome == "result"
    assert reply.result.result["price_aud"] == fare("QF431-20260310")
    assert reply.result.result["cabin"] == "economy"
    assert reply.result.result["approved_by"] is None
    assert ledger.count("r-travel") == before + 1


@pytest.mark.parametrize("flight_id", ["VA823-20260310", "VA823-20261201"])
async def test_a_booking_on_the_blocked_flight_stops_the_loop_and_books_nothing(
    flight_id: str,
) -> None:
    before = ledger.count()

    reply = await book(executor(), {"flight_id": flight_id, "cabin": "business"})

    assert reply.outcome == "terminate"
    assert reply.result.error is not None
    assert "VA823 is not covered by the company's travel agreement" in reply.result.error
    assert ledger.count() == before


async def test_a_business_booking_over_the_limit_waits_for_approval_then_books_once() -> None:
    flight_id = next(
        f"QF{n}-20260310" for n in range(400, 800) if fare(f"QF{n}-20260310", "business") > 1000
    )
    ex = executor()
    before = ledger.count("r-travel")
    arguments = {"flight_id": flight_id, "cabin": "business"}

    asked = await book(ex, arguments, call_id="c-dear")
    assert asked.outcome == "approval_required"
    assert asked.approval is not None
    assert ledger.count("r-travel") == before
    grant = ApprovalGrant(decision="approved", digest=asked.approval.digest, approver="bob")
    booked = await book(ex, arguments, call_id="c-dear", grant=grant)
    again = await book(ex, arguments, call_id="c-dear", grant=grant)

    assert booked.result.result["approved_by"] == "bob"
    assert booked.result.result["price_aud"] > 1000
    assert again.replayed
    assert ledger.count("r-travel") == before + 1
