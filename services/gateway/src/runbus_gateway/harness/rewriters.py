"""Output rewriters: they change the final answer's text (a disclaimer), registered by name
like guardrails:

    [harness]
    rewriters = [{name = "disclaimer", text = "Prices change; check before you book."}]
"""

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final

import msgspec

from runbus.messages import ChatMessage, TextContent

from ._registry import Registry


class Rewriter(
    msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, tag_field="name"
):
    """Changes the final answer's text. Subclasses are registered with `@rewriter`."""

    def rewrite(self, text: str) -> str:
        raise NotImplementedError


REWRITERS: Final = Registry("output rewriter", Rewriter)
rewriter = REWRITERS.register


@rewriter
class Disclaimer(Rewriter, frozen=True, tag="disclaimer"):
    """Appends a mandatory text to every final answer (once, also on a resumed run)."""

    text: Annotated[str, msgspec.Meta(min_length=1)]
    """The disclaimer."""
    separator: str = "\n\n"
    """Put between the answer and the disclaimer (not before an empty answer)."""

    def rewrite(self, text: str) -> str:
        disclaimer = self.text.strip()
        if text.rstrip().endswith(disclaimer):
            return text
        return f"{text}{self.separator}{disclaimer}" if text else disclaimer


def build_rewriters(tables: Sequence[Mapping[str, Any]]) -> list[Rewriter]:
    return REWRITERS.build(tables)


def rewrite_final(
    message: ChatMessage, rewriters: Sequence[Rewriter]
) -> tuple[ChatMessage, str | None]:
    """The final assistant message after `rewriters`, and the text appended to it.

    The appended text is what still has to be streamed (as one more text delta with the
    message's id) for a reader of the deltas to see the same answer; it is "" when nothing
    changed and None when a rewriter changed text that was already streamed.
    """
    original = message.text
    text = original
    for one in rewriters:
        text = one.rewrite(text)
    if text == original:
        return message, ""
    if text.startswith(original):
        added = text[len(original) :]
        contents = [*message.contents, TextContent(text=added)]
        return msgspec.structs.replace(message, contents=contents), added
    others = [c for c in message.contents if not isinstance(c, TextContent)]
    return msgspec.structs.replace(message, contents=[TextContent(text=text), *others]), None
