"""runbus tool executor: typed tools, argument validation, trusted-argument injection, function
middleware (approval, terminate), at-most-once side effects."""

from .middleware import (
    PROCEED,
    Call,
    Decision,
    Middleware,
    Modify,
    Proceed,
    Reject,
    RequireApproval,
    Terminate,
)
from .registry import FromProp, Tool, ToolContext, ToolRegistry, UnderRoot

__all__ = [
    "PROCEED",
    "Call",
    "Decision",
    "FromProp",
    "Middleware",
    "Modify",
    "Proceed",
    "Reject",
    "RequireApproval",
    "Terminate",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "UnderRoot",
]
