"""A tool that reads files, confined to the deployment's tool root (`RUNBUS_TOOL_ROOT`): the
pattern for any tool that takes a path from the model. Serve it with
`RUNBUS_TOOL_MODULES=runbus_examples.travel,runbus_tool_executor.documents`."""

from pathlib import Path
from typing import Annotated

import msgspec

from .registry import ToolRegistry, UnderRoot

tools = ToolRegistry()


class Document(msgspec.Struct):
    name: str
    text: str
    truncated: bool


@tools.tool()
def read_document(
    path: Annotated[Path, UnderRoot()],
    max_chars: Annotated[int, msgspec.Meta(ge=1, le=32_000)] = 16_000,
) -> Document:
    """Read a text document (an itinerary, a travel policy) by its path in the document
    folder, e.g. `policies/travel.md`."""
    if not path.is_file():
        # The message names the file, never the folder it lives in on this machine.
        raise FileNotFoundError(f"no document named {path.name!r}")
    text = path.read_text(errors="replace")
    return Document(name=path.name, text=text[:max_chars], truncated=len(text) > max_chars)
