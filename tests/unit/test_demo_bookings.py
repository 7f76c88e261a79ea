"""The demo books only what it was shown: the offline model takes a flight id exactly as
written, and a session that searched may book only a flight its search returned."""

from datetime import date
from typing import Any

from runbus.headers import RunContext
from runbus.messages import ChatMessage, ModelRequest, TextContent
from runbus_examples.offline import OfflineModel
from runbus_examples.travel import tools

WEDNESDAY = date(2026, 3, 4)


def session(session_id: str, tenant: str = "acme") -> RunContext:
    return RunContext(
        run_id=f"r-{session_id}",
        session_id=session_id,
        agent="travel",
        props={"user_id": "alice", "tenant": tenant},
    )


async def invoke(name: str, arguments: dict[str, Any], ctx: RunContext) -> Any:
    return await tools.tools[name].invoke("c1", arguments, ctx)


async def test_a_whole_flight_id_is_booked_exactly_as_written() -> None:
    request = ModelRequest(
        route="offline",
        messages=[ChatMessage(role="user", contents=[TextContent(text="Book JQ730-20261220")])],
        tools=[t.spec() for t in tools.tools.values()],
    )

    reply = await OfflineModel(today=WEDNESDAY).complete(request, lambda _: None)  # type: ignore[arg-type,return-value]

    [call] = reply.message.function_calls
    assert call.name == "create_booking"
    assert call.arguments == {"flight_id": "JQ730-20261220"}


async def test_a_flight_the_session_was_shown_is_booked_only_on_the_date_shown() -> None:
    searched = session("s-searched")
    found = await invoke(
        "search_flights",
        {"origin": "Perth", "destination": "Darwin", "date": "2026-12-20"},
        searched,
    )
    shown = sorted(f["flight_id"] for f in found.result)
    wrong_day = shown[0].split("-")[0] + "-20261210"

    refused = await invoke("create_booking", {"flight_id": wrong_day}, searched)
    booked = await invoke("create_booking", {"flight_id": shown[0]}, searched)

    assert refused.error is not None
    assert f"flight {wrong_day!r} was not in this session's search results" in refused.error
    assert f"was shown as {shown[0]}" in refused.error
    assert booked.error is None
    assert booked.result["flight_id"] == shown[0]


async def test_another_session_or_tenant_is_not_bound_by_that_search() -> None:
    found = await invoke(
        "search_flights",
        {"origin": "Perth", "destination": "Darwin", "date": "2026-12-21"},
        session("s-shared"),
    )
    other_day = found.result[0]["flight_id"].split("-")[0] + "-20261222"

    other_session = await invoke("create_booking", {"flight_id": other_day}, session("s-2"))
    other_tenant = await invoke(
        "create_booking", {"flight_id": other_day}, session("s-shared", tenant="globex")
    )

    assert other_session.error is None
    assert other_tenant.error is None
