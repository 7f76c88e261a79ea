"""The error family and how any failure becomes a typed error at a handler boundary."""

import msgspec
import pytest

from runbus.errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    ModelError,
    NotFound,
    RemoteError,
    RunbusError,
    Unauthenticated,
    Unavailable,
    UnknownAgent,
)
from runbus.messages import ErrorInfo
from runbus.messages.runs import RUN_REQUEST_DECODER
from runbus.service import as_runbus_error


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BadRequest, "bad_request"),
        (Unauthenticated, "unauthenticated"),
        (NotFound, "not_found"),
        (UnknownAgent, "unknown_agent"),
        (DeadlineExceeded, "deadline_exceeded"),
        (Unavailable, "unavailable"),
        (ModelError, "model_error"),
        (InternalError, "internal"),
    ],
)
def test_each_error_class_travels_as_its_stable_code(error: type[RunbusError], code: str) -> None:
    info = error("what happened", details={"field": "session_id"}).to_info()

    assert info == ErrorInfo(code=code, message="what happened", details={"field": "session_id"})


def test_an_error_without_details_has_empty_details() -> None:
    assert NotFound("no such session").to_info().details == {}


def test_an_unknown_agent_is_also_a_not_found() -> None:
    assert issubclass(UnknownAgent, NotFound)


def test_a_remote_error_keeps_the_code_the_other_service_sent() -> None:
    error = RemoteError("unknown_tool", "no tool named 'x'", details={"name": "x"})

    assert error.to_info() == ErrorInfo(
        code="unknown_tool", message="no tool named 'x'", details={"name": "x"}
    )
    assert str(error) == "unknown_tool: no tool named 'x'"


def test_a_runbus_error_passes_the_boundary_as_itself() -> None:
    error = Unauthenticated("unknown token")

    assert as_runbus_error(error) is error


def test_an_undecodable_body_becomes_a_bad_request_naming_the_field() -> None:
    body = b'{"type": "run.request", "run_id": "r", "agent": "a", "session_id": "a.b", "input": []}'
    with pytest.raises(msgspec.ValidationError) as raised:
        RUN_REQUEST_DECODER.decode(body)

    error = as_runbus_error(raised.value)

    assert isinstance(error, BadRequest)
    assert error.code == "bad_request"
    assert "$.session_id" in error.message


def test_malformed_json_becomes_a_bad_request() -> None:
    with pytest.raises(msgspec.DecodeError) as raised:
        RUN_REQUEST_DECODER.decode(b"{not json")

    assert as_runbus_error(raised.value).code == "bad_request"


def test_a_timeout_becomes_deadline_exceeded() -> None:
    assert as_runbus_error(TimeoutError()).code == "deadline_exceeded"


def test_any_other_failure_is_internal_and_does_not_leak_its_text() -> None:
    error = as_runbus_error(KeyError("postgres://admin:hunter2@db/secrets"))

    assert isinstance(error, InternalError)
    assert error.code == "internal"
    assert "hunter2" not in error.message
    assert "KeyError" in error.message
