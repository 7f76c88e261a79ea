"""Hostile bodies on every client API subject, sent by a client with valid credentials, get a
`bad_request` error reply, never `internal`: JSON nested past the parser's stack, invalid
UTF-8, numbers out of every range. The subjects come from the ops table, so a new API
operation is fuzzed as soon as it exists; and the service still answers afterwards."""

from typing import Final

import pytest
from nats.aio.client import Client as NATS

import runbus.client
from runbus import headers as h
from runbus import ops
from runbus.messages.errors import ERROR_DECODER
from runbus.messages.runs import AgentList
from tests.helpers import publish_and_collect, types
from tests.stack import SecuredNats, Stack

DEPTH: Final = 100_000
DEEP: Final = b"[" * DEPTH + b"]" * DEPTH
BODIES: Final = {
    "deep array": DEEP,
    "deep object": b'{"a": ' * DEPTH + b"1" + b"}" * DEPTH,
    "deep in a field of any JSON": b'{"type": "x", "arguments": {"a": ' + DEEP + b"}}",
    "invalid UTF-8 in a string": b'{"type": "\xff\xfe", "session_id": "\xc3"}',
    "invalid UTF-8 outside strings": b"\xff\xfe{}",
    "exponent past any float": b'{"type": 1e999999, "limit": -1e999999}',
    "not JSON": b"\x00\x01 not json {",
}
API_OPS: Final = sorted(
    {
        op.subject
        for op in (*ops.ALL, *(ops.api_op(forwarded) for forwarded in ops.FORWARDED))
        if isinstance(op, ops.Op) and op.subject.startswith("runbus.api.")
    }
)


@pytest.mark.parametrize("subject", API_OPS)
async def test_a_hostile_body_on_a_client_api_subject_is_a_bad_request(
    stack: Stack, nats_server: SecuredNats, subject: str
) -> None:
    nc = await runbus.client.open_connection(nats_server.client_url, "dev-bob")
    try:
        answers = {}
        for case, body in BODIES.items():
            reply = await nc.request(subject, body, headers={h.AUTH: "Bearer dev-bob"}, timeout=10)
            code = (reply.headers or {}).get(h.ERROR)
            message = ERROR_DECODER.decode(reply.data).error.message if code else ""
            answers[case] = (code, message[:120])
        still = await runbus.client.RunbusClient(nc, token="dev-bob").call(
            ops.API_AGENTS_LIST, AgentList()
        )
    finally:
        await nc.drain()

    assert {case: code for case, (code, _) in answers.items()} == dict.fromkeys(
        BODIES, "bad_request"
    ), answers
    assert still.agents


@pytest.mark.parametrize(
    "where",
    [b'"result": ' + DEEP, b'"result": {"a": ' + b'{"a": ' * DEPTH + b"1" + b"}" * DEPTH + b"}"],
    ids=["deep array", "deep object"],
)
async def test_a_run_request_nested_past_the_parser_s_stack_fails_as_a_bad_request_at_once(
    stack: Stack, nc: NATS, where: bytes
) -> None:
    run_id = "r-deep"
    body = (
        b'{"type": "run.request", "run_id": "r-deep", "agent": "travel", "session_id": "s1", '
        b'"input": [{"role": "tool", "contents": [{"type": "function_result", '
        b'"call_id": "c", ' + where + b"}]}]}"
    )

    events = await publish_and_collect(nc, run_id, body)

    assert types(events) == ["run.failed"]
    assert events[0]["error"]["code"] == "bad_request"
