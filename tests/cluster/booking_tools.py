"""The cluster workload's tools, loaded by every tool_executor of the cluster harness
(`RUNBUS_TOOL_MODULES=tests.cluster.booking_tools`): a weather look-up and a booking with a
side effect recorded in `<RUNBUS_DATA_DIR>/bookings.jsonl` of the executor's host, so the
checker sees a booking made twice whichever host made it. A business booking waits for a
person's approval."""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from runbus_examples import travel
from runbus_tool_executor.registry import FromProp, ToolContext, ToolRegistry
from tests.helpers import take_time

LEDGER_FILE = "bookings.jsonl"
LATENCY = 0.3
"""Seconds each tool takes, as a real API would: a fault finds runs inside their tools."""

tools = ToolRegistry()


@tools.tool()
async def get_weather(city: travel.City) -> travel.Weather:
    """Current weather for a city (demo data, deterministic)."""
    await take_time(LATENCY)
    weather: travel.Weather = travel.get_weather(city)
    return weather


def business_needs_approval(arguments: Mapping[str, Any]) -> str | None:
    if arguments.get("cabin") == "business":
        return "a business fare needs a person's approval"
    return None


@tools.tool(side_effect=True, approval=business_needs_approval, timeout=5.0)
async def create_booking(
    flight_id: travel.FlightId,
    user_id: Annotated[str, FromProp("user_id")],
    context: ToolContext,
    cabin: Literal["economy", "business"] = "economy",
) -> dict[str, str]:
    """Book a seat on a flight for the signed-in user."""
    # Half the latency on each side of the write: a pause or a cut may land on either.
    await take_time(LATENCY / 2)
    line = json.dumps(
        {"run_id": context.run_id, "call_id": context.call_id, "host_pid": os.getpid()}
    )
    # One O_APPEND write: whole lines even with several executors, kept through a SIGKILL.
    fd = os.open(
        Path(os.environ["RUNBUS_DATA_DIR"]) / LEDGER_FILE,
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
    await take_time(LATENCY / 2)
    return {"confirmation": f"RB-{context.run_id}", "flight_id": flight_id, "cabin": cabin}
