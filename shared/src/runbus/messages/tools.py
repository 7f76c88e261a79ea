"""Tool executor requests and replies (`runbus.tools.<name>.invoke`, `runbus.tools.list`)."""

from typing import Any

import msgspec

from ._base import Message
from .contents import FunctionResultContent
from .model import ToolSpec


class ToolInvoke(Message, frozen=True, tag="tools.invoke"):
    call_id: str
    """The model's call id, echoed in the result."""
    name: str
    """Tool to run; must match the subject it was sent on."""
    arguments: dict[str, Any] = {}
    """Model-chosen arguments: validated against the tool's schema before the tool runs."""


class ToolInvoked(Message, frozen=True, tag="tools.invoked"):
    result: FunctionResultContent
    """The result; a validation or tool error is a result with `error` set, not a failure."""


class ToolList(Message, frozen=True, tag="tools.list"):
    names: list[str] | None = None
    """Only these tools (an agent's allow-list); None lists all."""


class ToolCatalog(Message, frozen=True, tag="tools.catalog"):
    tools: list[ToolSpec]
    """Schemas as the model sees them."""


TOOL_INVOKE_DECODER = msgspec.json.Decoder(ToolInvoke)
TOOL_INVOKED_DECODER = msgspec.json.Decoder(ToolInvoked)
TOOL_LIST_DECODER = msgspec.json.Decoder(ToolList)
TOOL_CATALOG_DECODER = msgspec.json.Decoder(ToolCatalog)
