"""The demo travel tools and their policies: deterministic fake data, no network. Used by the
`travel` agent.

Policies: a booking over A$1000 needs a person's approval (economy fares are A$89 to A$388, so only
business fares ever do), and the corporate policy stops the tool loop on a booking of a flight
outside the company's travel agreement (VA823, as in the seed)."""

import hashlib
import threading
from collections.abc import Iterable, Mapping
from datetime import date
from typing import Annotated, Any, Final, Literal

import msgspec

from runbus_tool_executor.errors import InvalidArguments
from runbus_tool_executor.middleware import PROCEED, Call, Decision, Middleware, Terminate
from runbus_tool_executor.registry import FromProp, ToolContext, ToolRegistry

tools = ToolRegistry()

City = Annotated[str, msgspec.Meta(min_length=2, max_length=64, pattern=r"^[A-Za-z .'-]+$")]
FlightId = Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{2}[0-9]{2,4}-[0-9]{8}$")]
Cabin = Literal["economy", "business"]

APPROVAL_ABOVE_AUD: Final = 1000
"""A booking dearer than this waits for a person's approval."""
BLOCKED_FLIGHTS: Final = ("VA823",)
"""Outside the corporate travel agreement (the seed's example). The demo timetable's flight
numbers run 400 to 799, so the flights the offline model picks are never among them."""

_CONDITIONS = ("sunny", "partly cloudy", "light rain", "windy", "clear")
_CARRIERS = (("Qantas", "QF"), ("Virgin Australia", "VA"), ("Jetstar", "JQ"))


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("|".join(parts).lower().encode()).digest()[:4], "big")


def fare(flight_id: str, cabin: Cabin = "economy") -> int:
    """The price in A$ of a seat: economy A$89 to A$388, business three times that plus 400."""
    economy = 89 + _seed(flight_id, "fare") % 300
    return economy if cabin == "economy" else economy * 3 + 400


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
    """Economy fare."""
    business_price_aud: int


class Booking(msgspec.Struct):
    confirmation: str
    flight_id: str
    passenger: str
    tenant: str
    seat: str
    cabin: str = "economy"
    price_aud: int = 0
    approved_by: str | None = None


class Ledger:
    """The bookings this process made: the demo's stand-in for an airline's system."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bookings: list[tuple[str, Booking]] = []

    def record(self, run_id: str, booking: Booking) -> None:
        with self._lock:
            self._bookings.append((run_id, booking))

    def count(self, run_id: str | None = None) -> int:
        return len(self.bookings(run_id))

    def bookings(self, run_id: str | None = None) -> list[Booking]:
        with self._lock:
            return [b for run, b in self._bookings if run_id is None or run == run_id]


ledger = Ledger()


class Searches:
    """The flights each session's searches returned, as this process saw them: a flight the
    session was shown is booked only as shown, so a misread id (the flight number it saw on
    another date, at another price) is refused instead of booked. A flight number the session
    never saw here (the user named it, or another replica ran the search) is not checked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shown: dict[tuple[str, str], set[str]] = {}

    def record(self, context: ToolContext, flights: Iterable["Flight"]) -> None:
        key = (context.props.get("tenant", ""), context.session_id)
        with self._lock:
            self._shown.setdefault(key, set()).update(f.flight_id for f in flights)

    def misread(self, context: ToolContext, flight_id: str) -> list[str]:
        """The ids the session was shown for the flight number of `flight_id`, if `flight_id`
        is not among them (empty: nothing to object to)."""
        number = flight_id.split("-")[0]
        with self._lock:
            shown = self._shown.get((context.props.get("tenant", ""), context.session_id), set())
            same_number = sorted(f for f in shown if f.split("-")[0] == number)
        return [] if flight_id in same_number else same_number


searches = Searches()


@tools.tool(inline=True)  # a lookup in memory: no thread per call
def get_weather(city: City) -> Weather:
    """Current weather for a city (demo data, deterministic)."""
    seed = _seed(city)
    return Weather(
        city=city.title(),
        temperature_c=12 + seed % 20,
        conditions=_CONDITIONS[seed % len(_CONDITIONS)],
    )


def search_flights(origin: str, destination: str, date: date) -> list[Flight]:
    """Flights between two cities on a date, cheapest first (demo data, deterministic)."""
    flights = []
    for airline, code in _CARRIERS:
        seed = _seed(origin, destination, date.isoformat(), code)
        flight_id = f"{code}{400 + seed % 400}-{date.strftime('%Y%m%d')}"
        flights.append(
            Flight(
                flight_id=flight_id,
                airline=airline,
                origin=origin.title(),
                destination=destination.title(),
                date=date.isoformat(),
                departs=f"{6 + seed % 14:02d}:{(seed // 7) % 4 * 15:02d}",
                price_aud=fare(flight_id),
                business_price_aud=fare(flight_id, "business"),
            )
        )
    return sorted(flights, key=lambda f: f.price_aud)


@tools.tool(name="search_flights", inline=True)
def search_flights_tool(
    origin: City, destination: City, date: date, context: ToolContext
) -> list[Flight]:
    """Flights between two cities on a date, cheapest first (demo data, deterministic)."""
    flights = search_flights(origin, destination, date)
    searches.record(context, flights)
    return flights


def needs_approval(arguments: Mapping[str, Any]) -> str | None:
    """A booking over the limit needs a person's approval; the price comes from the fare
    table, never from the model."""
    price = fare(arguments["flight_id"], arguments.get("cabin", "economy"))
    if price > APPROVAL_ABOVE_AUD:
        return f"A${price} is over the A${APPROVAL_ABOVE_AUD} booking limit"
    return None


# Inline: the booking is recorded in memory (a real one would be `async def`, calling an API).
@tools.tool(side_effect=True, approval=needs_approval, timeout=5.0, inline=True)
def create_booking(
    flight_id: FlightId,
    user_id: Annotated[str, FromProp("user_id")],
    context: ToolContext,
    seat: Literal["window", "aisle", "any"] = "any",
    cabin: Cabin = "economy",
) -> Booking:
    """Book a seat on a flight for the signed-in user. The passenger comes from the run's
    identity, never from the model; bookings over A$1000 wait for a person's approval."""
    if shown := searches.misread(context, flight_id):
        raise InvalidArguments(
            f"flight {flight_id!r} was not in this session's search results; "
            f"{flight_id.split('-')[0]} was shown as {', '.join(shown)}: book that, or search "
            "again for another date"
        )
    booking = Booking(
        confirmation="RB-"
        + hashlib.sha256(f"{context.run_id}|{flight_id}".encode()).hexdigest()[:6].upper(),
        flight_id=flight_id,
        passenger=user_id,
        tenant=context.props.get("tenant", ""),
        seat=seat,
        cabin=cabin,
        price_aud=fare(flight_id, cabin),
        approved_by=context.approved_by or None,
    )
    ledger.record(context.run_id, booking)
    return booking


def corporate_policy(blocked: Iterable[str] = BLOCKED_FLIGHTS) -> Middleware:
    """Stop the tool loop on a booking of a blocked flight (`VA823`) or carrier (`VA`):
    the model has already chosen, the runtime does not let it go on."""
    refused = {b.upper() for b in blocked}

    def check(call: Call) -> Decision:
        if call.tool != "create_booking":
            return PROCEED
        flight = str(call.arguments.get("flight_id", "")).split("-")[0].upper()
        if flight in refused or flight[:2] in refused:
            return Terminate(
                error=f"{flight} is not covered by the company's travel agreement; nothing "
                "was booked and the booking was stopped."
            )
        return PROCEED

    return check


tools.use(corporate_policy())
