"""A tool that takes a while, loaded into the bench's tool_executor processes
(`RUNBUS_TOOL_MODULES`) so a run is still in flight when the bench kills its gateway."""

import asyncio

from runbus_tool_executor.registry import ToolRegistry

tools = ToolRegistry()


@tools.tool(timeout=30.0)
async def wait_a_moment(seconds: float) -> str:
    """Waits `seconds`, like a slow remote API."""
    await asyncio.sleep(seconds)
    return f"waited {seconds:g} s"
