"""A client's live events come through one consumer per connection, delivering into its own
inbox: runs streamed at once on one connection each get their own events, and a run streamed
again (its request re-sent) replays what it did instead of waiting for events that are over."""

import asyncio

import runbus.client
from runbus.messages import RunCompleted, RunEvent, RunStarted
from tests.stack import SecuredNats, Stack

CITIES = ("Sydney", "Perth", "Hobart")


async def test_runs_streamed_at_once_on_one_connection_each_get_their_own_events(
    stack: Stack, nats_server: SecuredNats
) -> None:
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:

        async def one(city: str) -> list[RunEvent]:
            events = alice.stream(
                "travel", f"Weather in {city}?", session_id=f"s-{city}", run_id=f"r-{city}"
            )
            return [event async for event in events]

        streamed = await asyncio.gather(*(one(city) for city in CITIES))

    for city, events in zip(CITIES, streamed, strict=True):
        assert {e.run_id for e in events} == {f"r-{city}"}
        assert isinstance(events[0], RunStarted)
        assert isinstance(events[-1], RunCompleted)
        assert city in events[-1].text


async def test_a_run_streamed_again_replays_its_events_and_does_not_run_again(
    stack: Stack, nats_server: SecuredNats
) -> None:
    async with runbus.client.connect(nats_server.client_url, token="dev-alice") as alice:
        first = [
            e
            async for e in alice.stream("travel", "Weather in Perth?", session_id="s", run_id="r-1")
        ]
        again = [
            e
            async for e in alice.stream("travel", "Weather in Perth?", session_id="s", run_id="r-1")
        ]
        stored = [item.event async for item in alice.follow("r-1")]

    assert again == first == stored
    assert [type(e) for e in stored].count(RunStarted) == 1
