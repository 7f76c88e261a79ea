"""Reading the tool-call arguments a model wrote: JSON text that should be an object, and often
almost is (a code fence around it, a trailing comma, a reply cut off before its closing brace).
"""

import json
import re
from typing import Any, Final

_FENCE: Final = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
_TRAILING_COMMA: Final = re.compile(r",\s*([}\]])")
_CLOSER: Final = {"{": "}", "[": "]"}


class ArgumentsError(ValueError):
    """The text is not a JSON object, even after the usual repairs."""


def parse_arguments(raw: str) -> tuple[dict[str, Any], bool]:
    """The arguments as a dict, and whether they had to be repaired to get it."""
    if not raw.strip():
        return {}, False
    try:
        return _as_object(json.loads(raw)), False
    except (json.JSONDecodeError, ArgumentsError) as first:
        repaired = _repair(raw)
        if repaired == raw:
            raise ArgumentsError(f"{first}") from None
        try:
            return _as_object(json.loads(repaired)), True
        except (json.JSONDecodeError, ArgumentsError):
            raise ArgumentsError(f"{first}") from None


def _as_object(value: Any) -> dict[str, Any]:
    # Some models encode the object twice: a JSON string holding the JSON object.
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ArgumentsError("arguments are a string, not an object") from None
    if not isinstance(value, dict):
        raise ArgumentsError(f"arguments must be an object, not {type(value).__name__}")
    return value


def _repair(raw: str) -> str:
    text = raw.strip()
    if match := _FENCE.match(text):
        text = match.group(1)
    text = _close(text)
    return _TRAILING_COMMA.sub(r"\1", text)


def _close(text: str) -> str:
    """Close a string and brackets left open by a reply that was cut off."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in _CLOSER:
            stack.append(_CLOSER[char])
        elif char in "}]" and stack and stack[-1] == char:
            stack.pop()
    if in_string:
        text += '"'
    return text + "".join(reversed(stack))
