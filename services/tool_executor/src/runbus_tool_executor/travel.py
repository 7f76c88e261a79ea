"""The demo travel tools: deterministic fake data, no network. Used by the `travel` agent."""

import hashlib
from datetime import date
from typing import Annotated, Literal

import msgspec

from .registry import FromProp, ToolContext, ToolRegistry

tools = ToolRegistry()

City = Annotated[str, msgspec.Meta(min_length=2, max_length=64, pattern=r"^[A-Za-z .'-]+$")]
FlightId = Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{2}[0-9]{2,4}-[0-9]{8}$")]

_CONDITIONS = ("sunny", "partly cloudy", "light rain", "windy", "clear")


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("|".join(parts).lower().encode()).digest()[:4], "big")


class Weather(msgspec.Struct):
    city: str
    temperature_c: int
    conditions: str


class Flight(msgspec.Struct):
    flight_id: str
    airline: str
    origin: str
    destination: str
    date: str
    departs: str
    price_aud: int


class Booking(msgspec.Struct):
    confirmation: str
    flight_id: str
    passenger: str
    tenant: str
    seat: str


@tools.tool()
def get_weather(city: City) -> Weather:
    """Current weather for a city (demo data, deterministic)."""
    seed = _seed(city)
    return Weather(
        city=city.title(),
        temperature_c=12 + seed % 20,
        conditions=_CONDITIONS[seed % len(_CONDITIONS)],
    )


@tools.tool()
def search_flights(origin: City, destination: City, date: date) -> list[Flight]:
    """Flights between two cities on a date, cheapest first (demo data, deterministic)."""
    flights = []
    for airline, code in (("Qantas", "QF"), ("Virgin Australia", "VA"), ("Jetstar", "JQ")):
        seed = _seed(origin, destination, date.isoformat(), code)
        number = 400 + seed % 500
        flights.append(
            Flight(
                flight_id=f"{code}{number}-{date.strftime('%Y%m%d')}",
                airline=airline,
                origin=origin.title(),
                destination=destination.title(),
                date=date.isoformat(),
                departs=f"{6 + seed % 14:02d}:{(seed // 7) % 4 * 15:02d}",
                price_aud=89 + seed % 300,
            )
        )
    return sorted(flights, key=lambda f: f.price_aud)


@tools.tool(side_effect=True)
def create_booking(
    flight_id: FlightId,
    user_id: Annotated[str, FromProp("user_id")],
    context: ToolContext,
    seat: Literal["window", "aisle", "any"] = "any",
) -> Booking:
    """Book a seat on a flight for the signed-in user. The passenger comes from the run's
    identity, never from the model."""
    return Booking(
        confirmation="RB-"
        + hashlib.sha256(f"{context.run_id}|{flight_id}".encode()).hexdigest()[:6].upper(),
        flight_id=flight_id,
        passenger=user_id,
        tenant=context.props.get("tenant", ""),
        seat=seat,
    )
