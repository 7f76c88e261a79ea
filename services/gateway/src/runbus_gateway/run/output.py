"""The final answer's checks: its shape (an output format: JSON, validated against a schema,
with one repair turn) and the output guardrails that must pass before any of it is shown."""

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from runbus.messages import ChatMessage, OutputFormat, TextContent

from ..errors import OutputBlocked, OutputInvalid
from ..harness.guardrails import Guardrail, check

REPAIR_PROMPT = (
    "Your answer is not valid: {problem}. Answer again with only the JSON, valid against the "
    "schema you were given, and nothing else."
)


@dataclass(frozen=True)
class Invalid:
    """Why an answer does not have the output format's shape (for the repair turn and the
    `output_invalid` failure)."""

    problem: str


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def parse(text: str, output: OutputFormat) -> Any | Invalid:
    """The answer `text` as JSON valid for `output`, or why it is not."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return Invalid(f"not JSON ({exc.msg} at character {exc.pos})")
    if output.schema is None:
        return value if isinstance(value, dict) else Invalid("not a JSON object")
    error = jsonschema.exceptions.best_match(
        _validator(json.dumps(output.schema, sort_keys=True)).iter_errors(value)
    )
    if error is None:
        return value
    where = "/".join(str(p) for p in error.absolute_path)
    return Invalid(f"{error.message} at /{where}" if where else error.message)


def repair_message(invalid: Invalid, message_id: str) -> ChatMessage:
    """The one turn that shows the model why its answer was refused."""
    text = REPAIR_PROMPT.format(problem=invalid.problem)
    return ChatMessage(role="user", contents=[TextContent(text=text)], message_id=message_id)


def checked(
    text: str, output: OutputFormat | None, *, repaired: bool
) -> tuple[Any, Invalid | None]:
    """The parsed output of a final answer (None without an output format), or why it needs
    the repair turn; a second invalid answer raises `OutputInvalid`."""
    if output is None:
        return None, None
    value = parse(text, output)
    if not isinstance(value, Invalid):
        return value, None
    if repaired:
        raise OutputInvalid(value.problem)
    return None, value


def guard(guardrails: Sequence[Guardrail], message: ChatMessage) -> None:
    """Raise `OutputBlocked` when an output guardrail trips on `message`'s text. The error
    names the guardrail, never the text or what matched in it."""
    refusal = check(guardrails, [message])
    if refusal is not None:
        raise OutputBlocked(refusal.guardrail, refusal.text)
