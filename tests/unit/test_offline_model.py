"""The offline model: deterministic, drives the travel tools, streams its answers."""

from datetime import date

import pytest

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionCallContent,
    ModelRequest,
    ModelResponse,
    TextContent,
    ToolSpec,
)
from runbus_examples.offline import OfflineModel, cities_in, travel_date
from runbus_examples.travel import needs_approval
from runbus_examples.travel import tools as travel

WEDNESDAY = date(2026, 3, 4)
ALL_TOOLS = [t.spec() for t in travel.tools.values()]
ALICE = RunContext(run_id="r-1", session_id="s1", agent="travel", props={"user_id": "alice"})


class Deltas:
    def __init__(self) -> None:
        self.pieces: list[str] = []

    async def __call__(self, piece: str) -> None:
        self.pieces.append(piece)


def user(text: str) -> ChatMessage:
    return ChatMessage(role="user", contents=[TextContent(text=text)])


def remembered(text: str) -> ChatMessage:
    return ChatMessage(role="user", contents=[TextContent(text=text)], source="context_provider")


async def ask(
    messages: list[ChatMessage], tools: list[ToolSpec] = ALL_TOOLS, deltas: Deltas | None = None
) -> ModelResponse:
    request = ModelRequest(route="offline", messages=messages, tools=tools)
    return await OfflineModel(today=WEDNESDAY).complete(request, deltas or Deltas())


async def run_tools(messages: list[ChatMessage], reply: ModelResponse) -> list[ChatMessage]:
    """The prompt after the model's calls ran against the real travel tools."""
    results = [
        await travel.tools[c.name].invoke(c.call_id, c.arguments, ALICE)
        for c in reply.message.function_calls
    ]
    return [*messages, reply.message, ChatMessage(role="tool", contents=list(results))]


def only_call(reply: ModelResponse) -> FunctionCallContent:
    (call,) = reply.message.function_calls
    return call


async def test_a_weather_question_calls_get_weather_for_the_city_named() -> None:
    reply = await ask([user("Weather in Sydney?")])

    assert reply.finish_reason == "tool_calls"
    assert only_call(reply).name == "get_weather"
    assert only_call(reply).arguments == {"city": "Sydney"}


async def test_a_weather_question_about_two_cities_calls_get_weather_for_each_in_order() -> None:
    reply = await ask([user("What's the weather like in Tokyo and in Perth today?")])

    assert [(c.name, c.arguments) for c in reply.message.function_calls] == [
        ("get_weather", {"city": "Tokyo"}),
        ("get_weather", {"city": "Perth"}),
    ]
    assert len({c.call_id for c in reply.message.function_calls}) == 2


async def test_after_the_weather_result_the_answer_reports_the_tools_data() -> None:
    prompt = [user("Weather in Sydney?")]
    prompt = await run_tools(prompt, await ask(prompt))
    weather = prompt[-1].function_results[0].result

    reply = await ask(prompt)

    assert reply.finish_reason == "stop"
    assert not reply.message.function_calls
    assert f"{weather['temperature_c']}°C" in reply.message.text
    assert weather["conditions"] in reply.message.text
    assert "Sydney" in reply.message.text


async def test_a_flight_request_searches_that_route_on_the_date_meant() -> None:
    reply = await ask([user("Book me a flight from Melbourne to Sydney next Tuesday")])

    assert only_call(reply).name == "search_flights"
    assert only_call(reply).arguments == {
        "origin": "Melbourne",
        "destination": "Sydney",
        "date": "2026-03-10",
    }


async def test_after_the_search_the_cheapest_flight_is_booked() -> None:
    prompt = [user("Book me a flight from Melbourne to Sydney next Tuesday")]
    prompt = await run_tools(prompt, await ask(prompt))
    flights = prompt[-1].function_results[0].result
    cheapest = min(flights, key=lambda f: f["price_aud"])

    reply = await ask(prompt)

    assert only_call(reply).name == "create_booking"
    assert only_call(reply).arguments == {"flight_id": cheapest["flight_id"]}


async def test_a_remembered_window_seat_preference_is_used_when_booking() -> None:
    prompt = [
        remembered("Recalled memories:\n<memory>I always want a window seat</memory>"),
        user("Book me a flight from Melbourne to Sydney next Tuesday"),
    ]
    prompt = await run_tools(prompt, await ask(prompt))

    reply = await ask(prompt)

    assert only_call(reply).name == "create_booking"
    assert only_call(reply).arguments["seat"] == "window"


async def test_the_booking_answer_reports_the_confirmation_the_tool_returned() -> None:
    prompt = [user("Book me a flight from Melbourne to Sydney next Tuesday")]
    prompt = await run_tools(prompt, await ask(prompt))
    prompt = await run_tools(prompt, await ask(prompt))
    booking = prompt[-1].function_results[0].result

    reply = await ask(prompt)

    assert reply.finish_reason == "stop"
    assert booking["confirmation"] in reply.message.text
    assert booking["flight_id"] in reply.message.text


async def test_no_tool_is_called_that_the_request_does_not_offer() -> None:
    reply = await ask([user("Weather in Sydney?")], tools=[])

    assert not reply.message.function_calls
    assert reply.finish_reason == "stop"


async def test_without_the_booking_tool_it_answers_with_the_search_instead_of_booking() -> None:
    offered = [t for t in ALL_TOOLS if t.name == "search_flights"]
    prompt = [user("Book me a flight from Melbourne to Sydney next Tuesday")]
    prompt = await run_tools(prompt, await ask(prompt, tools=offered))
    cheapest = prompt[-1].function_results[0].result[0]

    reply = await ask(prompt, tools=offered)

    assert not reply.message.function_calls
    assert cheapest["flight_id"] in reply.message.text


async def test_the_answer_is_streamed_in_pieces_that_join_to_the_full_text() -> None:
    prompt = [user("Weather in Sydney?")]
    prompt = await run_tools(prompt, await ask(prompt))
    deltas = Deltas()

    reply = await ask(prompt, deltas=deltas)

    assert len(deltas.pieces) > 1
    assert "".join(deltas.pieces) == reply.message.text


async def test_tool_calls_are_not_streamed_as_text() -> None:
    deltas = Deltas()

    await ask([user("Weather in Sydney?")], deltas=deltas)

    assert deltas.pieces == []


async def test_the_same_request_gets_the_same_reply() -> None:
    prompt = [user("What's the weather in Hobart and Darwin?")]

    first, second = await ask(prompt), await ask(prompt)

    assert first.message.contents == second.message.contents
    assert first.usage == second.usage
    assert first.usage.input_tokens > 0


def test_cities_are_found_in_the_order_they_are_written() -> None:
    assert cities_in("fly from sydney to MELBOURNE via Perth") == ["Sydney", "Melbourne", "Perth"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("on 2026-12-08", date(2026, 12, 8)),
        ("tomorrow", date(2026, 3, 5)),
        ("next Tuesday", date(2026, 3, 10)),
        ("on friday", date(2026, 3, 6)),
        ("next Wednesday", date(2026, 3, 11)),
        ("some time", date(2026, 3, 11)),
    ],
)
def test_travel_dates_are_read_relative_to_today(text: str, expected: date) -> None:
    assert travel_date(text, WEDNESDAY) == expected


async def test_a_business_booking_asks_for_business_and_needs_a_persons_approval() -> None:
    reply = await ask([user("Book QF412 on Friday in business")])

    assert only_call(reply).arguments == {"flight_id": "QF412-20260306", "cabin": "business"}
    assert "over the A$1000 booking limit" in (needs_approval(only_call(reply).arguments) or "")


async def test_a_booking_that_names_no_cabin_stays_in_economy_under_the_limit() -> None:
    reply = await ask([user("Book QF412 on Friday")])

    assert only_call(reply).arguments == {"flight_id": "QF412-20260306"}
    assert needs_approval(only_call(reply).arguments) is None
