"""Bad input gets a clear, typed error; the services keep serving."""

import json

import pytest
from nats.aio.client import Client as NATS

from runbus import subjects
from tests.helpers import eventually, publish_and_collect, raw_request, types
from tests.stack import Stack

VALID = json.loads(raw_request("r-x", "Weather in Sydney?"))


def _body(**changes: object) -> bytes:
    body = {**VALID, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("run_id", "body", "kwargs", "code", "says"),
    [
        ("r-bad-json", b'{"type": "run.request", "run_id": ', {}, "bad_request", "JSON"),
        ("r-bad-type", _body(type="run.nope", run_id="r-bad-type"), {}, "bad_request", "type"),
        ("r-no-input", _body(run_id="r-no-input", input=None), {}, "bad_request", "input"),
        ("r-bad-sid", _body(run_id="r-bad-sid", session_id="a.b"), {}, "bad_request", "session_id"),
        (
            "r-no-agent",
            _body(run_id="r-no-agent", agent="nope"),
            {"subject": "runbus.runs.nope"},
            "unknown_agent",
            "nope",
        ),
        ("r-mismatch", _body(run_id="r-mismatch", agent="other"), {}, "bad_request", "other"),
        (
            "r-bad-token",
            _body(run_id="r-bad-token"),
            {"token": "dev-mallory"},
            "unauthenticated",
            "token",
        ),
        ("r-no-token", _body(run_id="r-no-token"), {"token": None}, "unauthenticated", "rb-auth"),
        (
            "r-not-utf8",
            _body(run_id="r-not-utf8").replace(b"Weather", b"\xff\xfeWeather"),
            {},
            "bad_request",
            "UTF-8",
        ),
        (
            "r-msg-id",
            _body(run_id="r-other-id"),
            {},
            "bad_request",
            "Nats-Msg-Id",
        ),
    ],
)
async def test_bad_run_request_fails_with_a_typed_error_and_the_next_run_succeeds(
    stack: Stack,
    nc: NATS,
    run_id: str,
    body: bytes,
    kwargs: dict[str, object],
    code: str,
    says: str,
) -> None:
    events = await publish_and_collect(nc, run_id, body, **kwargs)  # type: ignore[arg-type]

    assert types(events) == ["run.failed"]
    assert events[0]["run_id"] == run_id
    assert events[0]["error"]["code"] == code
    assert says in events[0]["error"]["message"]

    after = await publish_and_collect(nc, f"{run_id}-ok", raw_request(f"{run_id}-ok", "Weather?"))
    assert types(after)[-1] == "run.completed"
    # Final at the first attempt: nothing waits for a retry or went to the dead letters.
    js = nc.jetstream()

    async def queue_empty() -> bool:
        return (await js.stream_info(subjects.RUNS_STREAM)).state.messages == 0

    await eventually(queue_empty)
    assert (await js.stream_info(subjects.DEAD_STREAM)).state.messages == 0


@pytest.mark.parametrize(
    ("subject", "body", "headers", "code"),
    [
        (subjects.HISTORY_LOAD, b"not json", {"rb-prop-tenant": "acme"}, "bad_request"),
        (
            subjects.HISTORY_LOAD,
            b'{"type": "history.load", "session_id": "s1"}',
            {},
            "unauthenticated",
        ),
        (
            subjects.HISTORY_APPEND,
            b'{"type": "history.load", "session_id": "s1"}',
            {"rb-prop-tenant": "acme"},
            "bad_request",
        ),
        (subjects.MEMORY_SEARCH, b'{"type": "memory.search", "query": "x"}', {}, "unauthenticated"),
        (
            subjects.MEMORY_SEARCH,
            b'{"type": "memory.search", "query": "x", "limit": 0}',
            {"rb-prop-tenant": "acme", "rb-prop-user_id": "alice"},
            "bad_request",
        ),
        (
            subjects.MODEL_COMPLETE,
            b'{"type": "model.complete", "route": "gpt-9", "messages": []}',
            {},
            "unknown_route",
        ),
        (subjects.COMPACTION_COMPACT, b"[]", {}, "bad_request"),
        (subjects.TOOLS_LIST, b'{"type": "tools.list", "names": 7}', {}, "bad_request"),
        (
            subjects.tool_invoke("get_weather"),
            b'{"type": "tools.invoke", "call_id": "", "name": "get_weather"}',
            {},
            "bad_request",
        ),
        (
            subjects.HISTORY_LOAD,
            b'{"type": "history.load", "session_id": "s1"}',
            {"rb-prop-tenant": "acme", "rb-deadline": "1.0"},
            "deadline_exceeded",
        ),
    ],
)
async def test_bad_service_request_gets_an_error_reply_and_the_service_keeps_serving(
    stack: Stack, nc: NATS, subject: str, body: bytes, headers: dict[str, str], code: str
) -> None:
    reply = await nc.request(subject, body, headers=headers, timeout=5)

    assert reply.headers is not None
    assert reply.headers["rb-error"] == code
    error = json.loads(reply.data)
    assert error["type"] == "error"
    assert error["error"]["code"] == code
    assert error["error"]["message"]

    events = await publish_and_collect(nc, "r-still-ok", raw_request("r-still-ok", "Weather?"))
    assert types(events)[-1] == "run.completed"


async def test_invalid_tool_arguments_reach_the_model_as_a_readable_error(
    stack: Stack, nc: NATS
) -> None:
    body = json.dumps(
        {
            "type": "tools.invoke",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": {"city": "Sydney; rm -rf /"},
        }
    ).encode()
    reply = await nc.request(subjects.tool_invoke("get_weather"), body, timeout=5)

    result = json.loads(reply.data)["result"]
    assert result["call_id"] == "c1"
    assert result["result"] is None
    assert "city" in result["error"]
