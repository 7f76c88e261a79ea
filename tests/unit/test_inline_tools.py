"""Cheap sync tools declared `inline` run on the event loop; other sync tools in a thread."""

import threading

from runbus.headers import RunContext
from runbus_tool_executor.registry import ToolRegistry

CTX = RunContext(run_id="r-1", props={"tenant": "acme", "user_id": "alice"})


async def test_an_inline_tool_runs_on_the_loop_and_a_plain_sync_tool_in_a_thread() -> None:
    registry = ToolRegistry()

    @registry.tool(inline=True)
    def where_inline() -> str:
        """Name of the thread running the call."""
        return threading.current_thread().name

    @registry.tool()
    def where_threaded() -> str:
        """Name of the thread running the call."""
        return threading.current_thread().name

    inline = await registry.tools["where_inline"].invoke("c1", {}, CTX)
    threaded = await registry.tools["where_threaded"].invoke("c2", {}, CTX)

    assert inline.result == threading.current_thread().name
    assert threaded.result == "tool-where_threaded"
