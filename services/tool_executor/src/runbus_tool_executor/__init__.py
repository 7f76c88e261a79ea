"""runbus tool executor: typed tools, argument validation, trusted-argument injection."""

from .registry import FromProp, Tool, ToolContext, ToolRegistry

__all__ = ["FromProp", "Tool", "ToolContext", "ToolRegistry"]
