"""A tool module that writes one 300 KiB line to stdout as it is imported, the way a chatty
library might: the supervisor must pass it on and keep reading."""

import sys

from runbus_tool_executor.registry import ToolRegistry

LOUD_LINE_BYTES = 300 * 1024

sys.stdout.write("x" * LOUD_LINE_BYTES + "\n")
sys.stdout.flush()

tools = ToolRegistry()
