"""The travel tools for the chaos suite, with a booking ledger that outlives the process:
every `create_booking` that ran appends one line to `<RUNBUS_DATA_DIR>/bookings.jsonl`, so a
booking made twice is visible even when the executor that made it was SIGKILLed.

Loaded by the tool_executor processes with `RUNBUS_TOOL_MODULES=tests.chaos.ledger_tools`."""

import json
import os
from datetime import date
from pathlib import Path
from typing import Annotated

from runbus_examples import travel
from runbus_tool_executor.registry import FromProp, ToolContext, ToolRegistry
from tests.helpers import take_time

LEDGER_FILE = "bookings.jsonl"

LATENCY = 0.6
"""Seconds each tool takes, as a real API would: runs last long enough that a kill finds
several in flight."""

tools = ToolRegistry()


@tools.tool()
async def get_weather(city: travel.City) -> travel.Weather:
    """Current weather for a city (demo data, deterministic)."""
    await take_time(LATENCY)
    weather: travel.Weather = travel.get_weather(city)
    return weather


@tools.tool()
async def search_flights(
    origin: travel.City, destination: travel.City, date: date
) -> list[travel.Flight]:
    """Flights between two cities on a date, cheapest first (demo data, deterministic)."""
    await take_time(LATENCY)
    flights: list[travel.Flight] = travel.search_flights(origin, destination, date)
    return flights


def ledger_path(data_dir: Path) -> Path:
    return data_dir / LEDGER_FILE


@tools.tool(side_effect=True, timeout=5.0)
async def create_booking(
    flight_id: travel.FlightId,
    user_id: Annotated[str, FromProp("user_id")],
    context: ToolContext,
) -> travel.Booking:
    """Book a seat on a flight for the signed-in user."""
    # Half the latency before the booking and half after: a kill may land on either side.
    await take_time(LATENCY / 2)
    booking: travel.Booking = travel.create_booking(flight_id, user_id, context)
    line = json.dumps({"run_id": context.run_id, "call_id": context.call_id, "pid": os.getpid()})
    # One O_APPEND write per booking: whole lines even with two executors appending, and in
    # the page cache the moment it returns, so a SIGKILL right after loses nothing.
    fd = os.open(
        ledger_path(Path(os.environ["RUNBUS_DATA_DIR"])),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    await take_time(LATENCY / 2)
    return booking
