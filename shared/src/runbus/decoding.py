"""Bytes nobody vouches for (an HTTP body or header, a client's bus request) decoded once,
defensively: every way they can fail is a `BadRequest`, never an internal error.

msgspec raises `DecodeError` for most bad input, but `RecursionError` for JSON nested deeper
than its stack allows, `UnicodeDecodeError` for invalid UTF-8 in a string, and pydantic and
protobuf parsers raise `ValueError` subclasses of their own.
"""

from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import msgspec

from .errors import BadRequest

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

MAX_REASON: Final = 300
"""Characters of a parser's own message kept in the error (it may quote the input)."""
MAX_SEQUENCE: Final = 2**64 - 1
"""The largest stream sequence JetStream has (an unsigned 64-bit integer)."""

UNDECODABLE: Final = (msgspec.DecodeError, RecursionError, ValueError, OverflowError)
"""What decoding hostile bytes can raise: msgspec's own errors, nesting past the stack,
invalid UTF-8 and out-of-range numbers (`ValueError`, `OverflowError`), and the
`ValueError` subclasses pydantic and protobuf raise."""


class Decoder(Protocol[T_co]):
    """A msgspec decoder (or anything with its `decode`)."""

    def decode(self, buf: bytes, /) -> T_co: ...


class Undecodable(BadRequest):
    """The bytes are not a valid `what`: not parseable at all (`malformed`: bad syntax, bad
    UTF-8, nested too deep), or parseable but of the wrong shape."""

    def __init__(self, what: str, reason: str, *, malformed: bool) -> None:
        super().__init__(f"bad {what}: {reason}", details={"malformed": malformed})
        self.what = what
        self.reason = reason
        self.malformed = malformed


def decode_untrusted(decoder: Decoder[T] | Callable[[bytes], T], data: bytes, what: str) -> T:
    """`data` decoded by `decoder` (a msgspec decoder, or a function such as a pydantic
    model's `model_validate_json`), or `Undecodable` (a `BadRequest`) naming `what`."""
    decode = decoder if callable(decoder) else decoder.decode
    try:
        return decode(data)
    except UNDECODABLE as exc:
        raise undecodable(exc, what) from None


def undecodable(exc: BaseException, what: str) -> Undecodable:
    """The `Undecodable` a parser's failure `exc` becomes."""
    match exc:
        case RecursionError():
            return Undecodable(what, "JSON nested too deeply", malformed=True)
        case UnicodeError():
            return Undecodable(what, "not valid UTF-8", malformed=True)
        case msgspec.ValidationError():
            return Undecodable(what, _reason(exc), malformed=False)
        case msgspec.DecodeError():
            return Undecodable(what, f"not valid JSON: {_reason(exc)}", malformed=True)
        case _:
            return Undecodable(what, _reason(exc), malformed=False)


def sequence(raw: str, what: str) -> int:
    """A stream sequence a client sent as text (`Last-Event-ID`, `?after=`): 0 to 2^64 - 1."""
    text = raw.strip()
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else -1
    if not 0 <= value <= MAX_SEQUENCE:
        raise BadRequest(f"bad {what} {raw[:40]!r}: a stream sequence (an integer >= 0)")
    return value


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "…"
