"""Error replies as every caller reads them (`runbus.errors.remote_error`), and error codes as
one `ErrorCode` literal that still lets a newer producer's codes through."""

import importlib
from typing import Final, get_args

from runbus import headers as h
from runbus.errors import NotFound, RemoteError, RunbusError, remote_error
from runbus.messages import ErrorCode, ErrorInfo, ErrorReply, encode
from runbus.messages.errors import ERROR_CODES, ERROR_DECODER, known_code

from ._goldens import GOLDEN_DIR

SERVICE_ERRORS: Final = (
    "runbus_history.errors",
    "runbus_memory.errors",
    "runbus_model_router.errors",
    "runbus_tool_executor.errors",
)


def _subclasses(cls: type[RunbusError]) -> list[type[RunbusError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


def test_a_reply_without_the_error_header_is_no_error() -> None:
    assert remote_error(None, b'{"type": "sessions.deleted"}') is None
    assert remote_error({"other": "x"}, b"{}") is None


def test_an_error_reply_is_read_into_a_remote_error_with_code_message_and_details() -> None:
    body = encode(ErrorReply(error=NotFound("no such session", details={"id": "s1"}).to_info()))

    error = remote_error({h.ERROR: "not_found"}, body)

    assert isinstance(error, RemoteError)
    assert (error.remote_code, error.known_code) == ("not_found", "not_found")
    assert (error.message, error.details) == ("no such session", {"id": "s1"})
    assert error.to_info() == ERROR_DECODER.decode(body).error


def test_the_golden_error_reply_reads_as_the_code_it_carries() -> None:
    body = (GOLDEN_DIR / "error.json").read_bytes()
    info = ERROR_DECODER.decode(body).error

    error = remote_error({h.ERROR: info.code}, body)

    assert error is not None
    assert error.to_info() == info
    assert info.known_code == info.code


def test_a_code_a_newer_producer_added_still_decodes_and_is_kept_as_sent() -> None:
    body = b'{"type": "error", "error": {"code": "quota_of_the_future", "message": "later"}}'

    error = remote_error({h.ERROR: "quota_of_the_future"}, body)

    assert error is not None
    assert (error.remote_code, error.known_code) == ("quota_of_the_future", None)
    assert str(error) == "quota_of_the_future: later"
    assert error.to_info() == ErrorInfo(code="quota_of_the_future", message="later")


def test_an_error_body_that_does_not_decode_still_says_the_header_s_code() -> None:
    error = remote_error({h.ERROR: "unavailable"}, b"\xff not json")

    assert error is not None
    assert (error.remote_code, error.known_code) == ("unavailable", "unavailable")


def test_every_error_of_the_services_sends_a_code_of_the_literal() -> None:
    for module in SERVICE_ERRORS:
        importlib.import_module(module)
    classes: list[type[RunbusError]] = [RunbusError, *_subclasses(RunbusError)]
    modules = {cls.__module__ for cls in classes}

    assert {cls.code for cls in classes} <= ERROR_CODES
    assert set(SERVICE_ERRORS) <= modules


def test_only_the_literal_s_codes_are_known() -> None:
    assert [known_code(code) for code in get_args(ErrorCode)] == list(get_args(ErrorCode))
    assert known_code("Not_Found") is None
    assert known_code("") is None
