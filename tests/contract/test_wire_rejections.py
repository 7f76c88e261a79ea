"""What the wire types refuse, and that the refusal names the offending field."""

import json
from typing import Any

import msgspec
import pytest

from runbus import ops
from runbus.messages import ErrorInfo, TextContent
from runbus.messages.errors import ERROR_DECODER
from runbus.messages.runs import RUN_EVENT_DECODER, RUN_REQUEST_DECODER

from ._goldens import CONTENT_DECODER


def run_request(**overrides: Any) -> dict[str, Any]:
    body = {
        "type": "run.request",
        "run_id": "r-7f3a",
        "agent": "travel",
        "session_id": "s1",
        "input": [{"role": "user", "contents": [{"type": "text", "text": "Weather in Sydney?"}]}],
    }
    return {**body, **overrides}


def raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


UNSAFE_IDS = ["a.b", "s>", "", "s*", "a b", "x" * 129, "ünïcode", "s1\n"]


@pytest.mark.parametrize("session_id", UNSAFE_IDS)
def test_run_request_with_a_session_id_unsafe_as_a_subject_token_is_rejected(
    session_id: str,
) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.session_id`"):
        RUN_REQUEST_DECODER.decode(raw(run_request(session_id=session_id)))


@pytest.mark.parametrize("field", ["run_id", "agent"])
@pytest.mark.parametrize("value", ["a.b", "x>", "", "r1\n"])
def test_run_request_with_an_unsafe_run_id_or_agent_is_rejected_naming_it(
    field: str, value: str
) -> None:
    with pytest.raises(msgspec.ValidationError, match=rf"`\$\.{field}`"):
        RUN_REQUEST_DECODER.decode(raw(run_request(**{field: value})))


@pytest.mark.parametrize("session_id", UNSAFE_IDS)
def test_history_requests_with_an_unsafe_session_id_are_rejected(session_id: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.session_id`"):
        ops.HISTORY_LOAD.decode.decode(raw({"type": "history.load", "session_id": session_id}))
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.session_id`"):
        ops.HISTORY_APPEND.decode.decode(
            raw({"type": "history.append", "session_id": session_id, "messages": []})
        )


def test_longest_safe_session_id_is_accepted() -> None:
    request = RUN_REQUEST_DECODER.decode(raw(run_request(session_id="A-z_9" * 25 + "abc")))

    assert len(request.session_id) == 128


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (run_request(input="Weather in Sydney?"), r"`\$\.input`"),
        (
            run_request(input=[{"role": "robot", "contents": []}]),
            r"`\$\.input\[0\]\.role`",
        ),
        (
            run_request(input=[{"role": "user", "contents": [], "created_at": "yesterday"}]),
            r"`\$\.input\[0\]\.created_at`",
        ),
        (
            run_request(input=[{"role": "user", "contents": [], "source": "admin"}]),
            r"`\$\.input\[0\]\.source`",
        ),
        (
            run_request(input=[{"role": "user", "contents": [{"type": "text", "text": 7}]}]),
            r"`\$\.input\[0\]\.contents\[0\]\.text`",
        ),
        (
            run_request(input=[{"role": "user", "contents": [{"type": "video", "url": "x"}]}]),
            r"`\$\.input\[0\]\.contents\[0\]\.type`",
        ),
    ],
    ids=["input-not-a-list", "role", "created_at", "source", "text-not-a-string", "content-tag"],
)
def test_run_request_with_a_wrong_typed_value_is_rejected_naming_where(
    body: dict[str, Any], where: str
) -> None:
    with pytest.raises(msgspec.ValidationError, match=where):
        RUN_REQUEST_DECODER.decode(raw(body))


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"type": "run.text_delta", "run_id": "r", "message_id": "m", "delta": 7}, "delta"),
        ({"type": "run.completed", "run_id": "r", "response": {}, "text": ""}, "response"),
        (
            {"type": "run.failed", "run_id": "r", "error": {"code": 500, "message": "x"}},
            "error.code",
        ),
        (
            {
                "type": "run.tool_call",
                "run_id": "r",
                "call": {"type": "function_call", "call_id": "c", "name": "n", "arguments": []},
            },
            "call.arguments",
        ),
    ],
    ids=["delta", "response", "error-code", "call-arguments"],
)
def test_run_event_with_a_wrong_typed_value_is_rejected_naming_the_field(
    body: dict[str, Any], where: str
) -> None:
    with pytest.raises(msgspec.ValidationError, match=rf"`\$\.{where}`"):
        RUN_EVENT_DECODER.decode(raw(body))


def test_run_event_decoder_rejects_an_event_kind_it_does_not_know() -> None:
    body = {"type": "run.teleported", "run_id": "r-7f3a"}

    with pytest.raises(msgspec.ValidationError, match=r"`\$\.type`"):
        RUN_EVENT_DECODER.decode(raw(body))


def test_a_body_of_another_message_type_is_rejected_by_a_request_decoder() -> None:
    started = {"type": "run.started", "run_id": "r-7f3a", "session_id": "s1", "agent": "travel"}

    with pytest.raises(msgspec.ValidationError, match=r"`\$\.type`"):
        RUN_REQUEST_DECODER.decode(raw(started))


def test_model_request_with_tools_that_are_not_a_list_is_rejected() -> None:
    body = {"type": "model.complete", "route": "offline", "messages": [], "tools": {"a": 1}}

    with pytest.raises(msgspec.ValidationError, match=r"`\$\.tools`"):
        ops.MODEL_COMPLETE.decode.decode(raw(body))


def test_data_content_that_is_not_base64_is_rejected() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.data`"):
        CONTENT_DECODER.decode(raw({"type": "data", "data": "not base64!", "media_type": "x/y"}))


@pytest.mark.parametrize("text", ["", "x" * 8193])
def test_memory_store_refuses_empty_or_oversized_texts(text: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"`\$\.texts\[1\]`"):
        ops.MEMORY_STORE.decode.decode(raw({"type": "memory.store", "texts": ["ok", text]}))


@pytest.mark.parametrize(
    ("override", "where"),
    [({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"scope": "world"}, "scope")],
)
def test_memory_search_refuses_out_of_range_limits_and_unknown_scopes(
    override: dict[str, Any], where: str
) -> None:
    body = {"type": "memory.search", "query": "window seat", **override}

    with pytest.raises(msgspec.ValidationError, match=rf"`\$\.{where}`"):
        ops.MEMORY_SEARCH.decode.decode(raw(body))


def test_memory_search_defaults_to_the_users_five_best_memories() -> None:
    search = ops.MEMORY_SEARCH.decode.decode(raw({"type": "memory.search", "query": "seat"}))

    assert (search.scope, search.limit) == ("user", 5)


def test_unknown_fields_inside_nested_messages_and_contents_are_ignored() -> None:
    body = run_request(
        input=[
            {
                "role": "user",
                "priority": "high",
                "contents": [{"type": "text", "text": "Weather in Sydney?", "lang": "en"}],
            }
        ]
    )

    request = RUN_REQUEST_DECODER.decode(raw(body))

    assert request == RUN_REQUEST_DECODER.decode(raw(run_request()))
    assert request.input[0].contents == [TextContent(text="Weather in Sydney?")]


def test_error_reply_without_details_decodes_with_empty_details() -> None:
    reply = ERROR_DECODER.decode(
        raw({"type": "error", "error": {"code": "not_found", "message": "no such session"}})
    )

    assert reply.error == ErrorInfo(code="not_found", message="no such session", details={})
