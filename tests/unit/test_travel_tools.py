"""The demo travel tools: deterministic data, validated arguments, identity from the run."""

import re
from typing import Any

import pytest

from runbus.headers import RunContext
from runbus_examples.travel import tools

ALICE = RunContext(
    run_id="r-1", session_id="s1", agent="travel", props={"user_id": "alice", "tenant": "acme"}
)
FLIGHT_ID = re.compile(r"[A-Z]{2}[0-9]{2,4}-[0-9]{8}")


async def call(name: str, arguments: dict[str, Any], ctx: RunContext = ALICE) -> Any:
    result = await tools.tools[name].invoke("c1", arguments, ctx)
    assert result.error is None, result.error
    return result.result


def test_the_travel_package_serves_weather_search_and_booking() -> None:
    assert set(tools.tools) == {"get_weather", "search_flights", "create_booking"}
    assert tools.tools["create_booking"].side_effect


def test_the_booking_schema_hides_the_passenger_from_the_model() -> None:
    schema = tools.tools["create_booking"].spec().parameters

    assert set(schema["properties"]) == {"flight_id", "seat", "cabin"}
    assert "user_id" not in schema.get("required", [])
    assert schema["properties"]["seat"]["enum"] == ["aisle", "any", "window"]
    assert schema["additionalProperties"] is False


async def test_weather_is_the_same_for_the_same_city_whatever_its_case() -> None:
    first = await call("get_weather", {"city": "Sydney"})

    assert first == await call("get_weather", {"city": "sydney"})
    assert first["city"] == "Sydney"
    assert 12 <= first["temperature_c"] < 32


async def test_flight_search_returns_three_flights_cheapest_first() -> None:
    arguments = {"origin": "Melbourne", "destination": "Sydney", "date": "2026-03-10"}

    flights = await call("search_flights", arguments)

    assert len(flights) == 3
    assert [f["price_aud"] for f in flights] == sorted(f["price_aud"] for f in flights)
    assert all(FLIGHT_ID.fullmatch(f["flight_id"]) for f in flights)
    assert all(f["flight_id"].endswith("-20260310") for f in flights)
    assert {(f["origin"], f["destination"], f["date"]) for f in flights} == {
        ("Melbourne", "Sydney", "2026-03-10")
    }
    assert flights == await call("search_flights", arguments)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"origin": "Melbourne", "destination": "Sydney", "date": "next tuesday"}, "date"),
        ({"origin": "M", "destination": "Sydney", "date": "2026-03-10"}, "origin"),
        ({"origin": "Melbourne", "destination": "Syd; DROP", "date": "2026-03-10"}, "destination"),
    ],
)
async def test_a_bad_search_argument_is_an_error_result_naming_it(
    arguments: dict[str, Any], field: str
) -> None:
    result = await tools.tools["search_flights"].invoke("c1", arguments, ALICE)

    assert result.error is not None
    assert field in result.error


async def test_a_booking_is_made_for_the_signed_in_user_whatever_the_model_says() -> None:
    booking = await call(
        "create_booking",
        {"flight_id": "QF431-20260310", "seat": "window", "user_id": "mallory"},
    )

    assert booking["passenger"] == "alice"
    assert booking["tenant"] == "acme"
    assert booking["seat"] == "window"
    assert booking["flight_id"] == "QF431-20260310"


async def test_a_booking_confirmation_is_stable_for_the_same_run_and_flight() -> None:
    arguments = {"flight_id": "QF431-20260310"}
    other_run = RunContext(run_id="r-2", props=ALICE.props)

    first = await call("create_booking", arguments)
    again = await call("create_booking", arguments)
    elsewhere = await call("create_booking", arguments, other_run)

    assert first["confirmation"] == again["confirmation"]
    assert first["confirmation"] != elsewhere["confirmation"]
    assert re.fullmatch(r"RB-[0-9A-F]{6}", first["confirmation"])
    assert first["seat"] == "any"


async def test_a_booking_of_a_made_up_flight_id_is_refused() -> None:
    result = await tools.tools["create_booking"].invoke("c1", {"flight_id": "cheapest"}, ALICE)

    assert result.error is not None
    assert "flight_id" in result.error
