"""The offline model: a deterministic rule-based stand-in for an LLM, not a language model.

It understands just enough English to drive the demo travel tools (weather, flight search,
booking) so `make run` works with no network and no weights. It reads the same request, calls
tools the same way and streams through the same path as a real backend.
"""

import re
from datetime import date, timedelta
from typing import Any, Final

from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    TextContent,
)
from runbus_model_router.backend_kit import (
    assistant,
    estimate_usage,
    results_after,
    since_last_user,
    stream_words,
)
from runbus_model_router.backends import OnDelta

CITIES: Final = (
    "Adelaide",
    "Auckland",
    "Brisbane",
    "Cairns",
    "Canberra",
    "Darwin",
    "Hobart",
    "London",
    "Melbourne",
    "Paris",
    "Perth",
    "Singapore",
    "Sydney",
    "Tokyo",
)
WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_FLIGHT_NUMBER = re.compile(r"\b([A-Za-z]{2}\d{3,4})\b")
_FLIGHT_ID = re.compile(r"\b([A-Za-z]{2}\d{3,4}-\d{8})\b")
"""A whole flight id as the tools write it (`JQ730-20261220`): taken as it is, date and all."""
_ISO_DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")


def cities_in(text: str) -> list[str]:
    """Known cities in the order they appear."""
    found = [(text.lower().find(c.lower()), c) for c in CITIES if c.lower() in text.lower()]
    return [c for _, c in sorted(found)]


def travel_date(text: str, today: date) -> date:
    """`2026-12-08`, `tomorrow`, `next tuesday`, `on friday`; a week from today otherwise."""
    lowered = text.lower()
    if match := _ISO_DATE.search(lowered):
        return date.fromisoformat(match.group(1))
    if "tomorrow" in lowered:
        return today + timedelta(days=1)
    for index, day in enumerate(WEEKDAYS):
        if day in lowered:
            ahead = (index - today.weekday()) % 7 or 7
            return today + timedelta(days=ahead)
    return today + timedelta(days=7)


def seat_preference(text: str) -> str | None:
    """`window` or `aisle` if the user or a remembered preference names one."""
    lowered = text.lower()
    for seat in ("window", "aisle"):
        if f"{seat} seat" in lowered:
            return seat
    return None


def cabin_wanted(text: str) -> str | None:
    """`business` if the user asks for it (a fare over the booking limit, so the call waits
    for a person's approval); else the tool's default, economy."""
    return "business" if "business" in text.lower() else None


def _describe(name: str, result: Any) -> str:
    match name, result:
        case "get_weather", {"city": city, "temperature_c": t, "conditions": c}:
            return f"It's {t}°C and {c} in {city}."
        case "create_booking", {
            "confirmation": conf,
            "flight_id": flight,
            "passenger": who,
            "seat": seat,
        }:
            where = f", {seat} seat" if seat != "any" else ""
            return f"Booked {flight} for {who}{where}: confirmation {conf}."
        case "search_flights", [first, *_]:
            return (
                f"The cheapest flight is {first['airline']} {first['flight_id']} at "
                f"{first['departs']} for A${first['price_aud']}."
            )
        case "search_flights", []:
            return "I found no flights for that route."
    return f"{name} returned {result}."


class OfflineModel:
    """Deterministic tool-driving model for demos and offline runs."""

    name = "offline"

    def __init__(self, today: date | None = None) -> None:
        self.today = today

    async def complete(self, request: ModelRequest, on_delta: OnDelta) -> ModelResponse:
        user, turn = since_last_user(request.messages)
        text = user.text if user else ""
        step = sum(1 for m in turn if m.role == "assistant")
        remembered = " ".join(m.text for m in request.messages if m.source == "context_provider")
        calls = self._next_calls(text, turn, {t.name for t in request.tools}, remembered)
        if calls:
            message = assistant(list(calls), step=step)
            return ModelResponse(
                message=message,
                model=self.name,
                finish_reason="tool_calls",
                usage=estimate_usage(request.messages, message),
            )
        answer = self._answer(text, turn)
        await stream_words(answer, on_delta)
        message = assistant([TextContent(text=answer)], step=step)
        return ModelResponse(
            message=message,
            model=self.name,
            finish_reason="stop",
            usage=estimate_usage(request.messages, message),
        )

    def _next_calls(
        self, text: str, turn: list[ChatMessage], tools: set[str], remembered: str
    ) -> list[FunctionCallContent]:
        lowered = text.lower()
        called = [c for m in turn for c in m.function_calls]
        names = {c.name for c in called}
        cities = cities_in(text)
        if not called and "weather" in lowered and "get_weather" in tools:
            return [
                FunctionCallContent(
                    call_id=f"call-weather-{i}", name="get_weather", arguments={"city": city}
                )
                for i, city in enumerate(cities or ["Sydney"])
            ]
        wants_flight = any(w in lowered for w in ("flight", "fly", "book"))
        named = _FLIGHT_NUMBER.search(text)
        if not called and "book" in lowered and named and "create_booking" in tools:
            # "Book VA823 on Friday": the user chose the flight; no search needed.
            if whole := _FLIGHT_ID.search(text):
                flight_id = whole.group(1).upper()
            else:
                day = travel_date(text, self.today or date.today())
                flight_id = f"{named.group(1).upper()}-{day.strftime('%Y%m%d')}"
            arguments: dict[str, Any] = {"flight_id": flight_id}
            if cabin := cabin_wanted(text):
                arguments["cabin"] = cabin
            return [
                FunctionCallContent(
                    call_id="call-book-0", name="create_booking", arguments=arguments
                )
            ]
        if not called and wants_flight and len(cities) >= 2 and "search_flights" in tools:
            day = travel_date(text, self.today or date.today())
            return [
                FunctionCallContent(
                    call_id="call-search-0",
                    name="search_flights",
                    arguments={
                        "origin": cities[0],
                        "destination": cities[1],
                        "date": day.isoformat(),
                    },
                )
            ]
        if names == {"search_flights"} and "book" in lowered and "create_booking" in tools:
            flights = next(
                (r.result for r in results_after(turn) if r.error is None and r.result), None
            )
            if flights:
                arguments = {"flight_id": flights[0]["flight_id"]}
                if cabin := cabin_wanted(text):
                    arguments["cabin"] = cabin
                if seat := seat_preference(f"{remembered} {text}"):
                    arguments["seat"] = seat
                return [
                    FunctionCallContent(
                        call_id="call-book-0", name="create_booking", arguments=arguments
                    )
                ]
        return []

    def _answer(self, text: str, turn: list[ChatMessage]) -> str:
        calls = {c.call_id: c.name for m in turn for c in m.function_calls}
        results = results_after(turn)
        if not results and text.lower().startswith("remember"):
            return "Noted — I'll keep that in mind for next time."
        if not results:
            return (
                "I'm runbus's offline demo model, not a language model: I can tell you the "
                "weather in a city, and find or book a flight between two cities."
            )
        parts = []
        for result in results:
            name = calls.get(result.call_id, "tool")
            if result.error is not None:
                parts.append(f"{name} failed: {result.error}")
            elif name != "search_flights" or len(results) == 1:
                parts.append(_describe(name, result.result))
        return " ".join(parts)
