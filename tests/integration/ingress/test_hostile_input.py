"""Hostile input to every HTTP route gets a typed 4xx, never a 5xx: JSON nested far past any
parser's stack, invalid UTF-8, numbers out of every range, resume points past JetStream's
largest sequence, bearer tokens no NATS connection could carry. The routes come from the app
itself, so a new route is fuzzed as soon as it exists."""

import json
import re
from collections.abc import Iterator
from typing import Final

import aiohttp
import pytest

from runbus_ingress.app import ROUTES
from runbus_ingress.errors import OPENAI_PATHS
from tests.integration.ingress.conftest import ALICE

DEPTH: Final = 100_000
DEEP: Final = b"[" * DEPTH + b"]" * DEPTH
# Deep JSON where a typed field takes any JSON value (a tool call's arguments or result, A2A's
# params, OpenAI's tool messages): the parser recurses instead of refusing the shape.
DEEP_IN_ANY: Final = (
    b'{"agent": "travel", "jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"a": '
    + DEEP
    + b'}, "model": "travel", "input": [{"role": "user", "contents": [{"type": '
    b'"function_result", "call_id": "c", "result": '
    + DEEP
    + b'}]}], "messages": [{"role": "tool", "tool_call_id": "c", "content": '
    + DEEP
    + b"}]}"
)
BODIES: Final = {
    "deep inside a field of any JSON": DEEP_IN_ANY,
    "deep array": b"[" * DEPTH + b"]" * DEPTH,
    "deep object": b'{"agent": ' + b'{"a": ' * DEPTH + b"1" + b"}" * DEPTH + b"}",
    "deep inside a valid shape": (
        b'{"agent": "travel", "model": "travel", "messages": [], "input": '
        + b"[" * DEPTH
        + b"]" * DEPTH
        + b"}"
    ),
    "invalid UTF-8 in a string": b'{"agent": "travel", "text": "\xff\xfe\xc3", "model": "\xff"}',
    "invalid UTF-8 outside strings": b"\xff\xfe{}",
    "integer of 400 digits": b'{"agent": ' + b"9" * 400 + b', "model": ' + b"9" * 400 + b"}",
    "integer past 2^64": b'{"agent": 18446744073709551616, "run_id": 18446744073709551616}',
    "exponent past any float": b'{"agent": 1e999999, "model": -1e999999, "jsonrpc": 1e999999}',
    "NaN": b'{"agent": NaN}',
    "not JSON": b"\x00\x01 not json {",
}
HEADERS: Final = {
    "Last-Event-ID 2^64": {**ALICE, "Last-Event-ID": str(2**64)},
    "Last-Event-ID of 400 digits": {**ALICE, "Last-Event-ID": "9" * 400},
    "Last-Event-ID negative": {**ALICE, "Last-Event-ID": "-1"},
    "Last-Event-ID not a number": {**ALICE, "Last-Event-ID": "\u0661\u0662x"},
}
TOKENS: Final = {
    "non-ASCII token": "Bearer d\u00e9v-alice",
    "token of non-ASCII spaces": "Bearer dev\u00a0alice",
}
QUERIES: Final = {"after": str(2**64), "limit": "9" * 400, "session_id": "\u0000"}


def fill(path: str) -> str:
    """A route's path with its parameters set to ids that exist nowhere (no run starts)."""
    return re.sub(r"\{[^}]+\}", "nobody-has-this-id", path)


def routes() -> Iterator[tuple[str, str]]:
    for route in ROUTES:
        yield route.method, fill(route.path)


POSTS: Final = [(method, path) for method, path in routes() if method == "POST"]
EVERY: Final = list(routes())


def check(status: int, body: bytes, path: str, case: str) -> None:
    assert status < 500, f"{path} with {case}: {status} {body[:300]!r}"
    if path.startswith(OPENAI_PATHS) and status >= 400:
        error = json.loads(body)["error"]
        assert isinstance(error["type"], str), f"{path}: not OpenAI-shaped: {body!r}"


@pytest.mark.parametrize(("method", "path"), POSTS)
async def test_a_hostile_body_gets_a_4xx_on_every_route_that_reads_one(
    http: aiohttp.ClientSession, method: str, path: str
) -> None:
    for case, body in BODIES.items():
        for headers in (ALICE, {}):
            headers = {**headers, "Content-Type": "application/json"}
            async with http.request(method, path, data=body, headers=headers) as response:
                check(response.status, await response.read(), path, case)


@pytest.mark.parametrize(("method", "path"), EVERY)
async def test_a_hostile_header_or_query_gets_a_4xx_on_every_route(
    http: aiohttp.ClientSession, method: str, path: str
) -> None:
    for case, headers in HEADERS.items():
        async with http.request(method, path, headers=headers, data=b"{}") as response:
            check(response.status, await response.read(), path, case)
    for case, authorization in TOKENS.items():
        headers = {"Authorization": authorization}
        async with http.request(method, path, headers=headers, data=b"{}") as response:
            check(response.status, await response.read(), path, case)
    async with http.request(method, path, params=QUERIES, headers=ALICE) as response:
        check(response.status, await response.read(), path, "hostile query")


async def test_json_nested_past_the_parser_s_stack_is_a_400_saying_so(
    http: aiohttp.ClientSession,
) -> None:
    async with http.post("/v1/runs", data=DEEP_IN_ANY, headers=ALICE) as response:
        body = await response.json()

    assert response.status == 400
    assert body["error"]["code"] == "bad_request"
    assert "nested too deeply" in body["error"]["message"]


async def test_invalid_utf8_in_a_run_body_is_a_400(http: aiohttp.ClientSession) -> None:
    body = BODIES["invalid UTF-8 in a string"]
    async with http.post("/v1/runs", data=body, headers=ALICE) as response:
        answer = await response.json()

    assert response.status == 400
    assert "UTF-8" in answer["error"]["message"]


async def test_a_deep_chat_completion_body_is_an_openai_shaped_400(
    http: aiohttp.ClientSession,
) -> None:
    body = BODIES["deep inside a valid shape"]
    async with http.post("/v1/chat/completions", data=body, headers=ALICE) as response:
        answer = await response.json()

    assert response.status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["code"] == "bad_request"


async def test_a_resume_point_past_the_largest_stream_sequence_is_a_400(
    http: aiohttp.ClientSession,
) -> None:
    headers = {**ALICE, "Last-Event-ID": str(2**64)}
    async with http.get("/v1/runs/r-1/events", headers=headers) as response:
        answer = await response.json()

    assert response.status == 400
    assert answer["error"]["code"] == "bad_request"


async def test_a_non_ascii_bearer_token_is_a_401(http: aiohttp.ClientSession) -> None:
    headers = {"Authorization": TOKENS["non-ASCII token"]}
    async with http.get("/v1/runs", headers=headers) as response:
        answer = await response.json()

    assert response.status == 401
    assert answer["error"]["code"] == "unauthenticated"


async def test_a_deep_a2a_request_is_a_json_rpc_parse_error(http: aiohttp.ClientSession) -> None:
    async with http.post("/v1/a2a/travel", data=DEEP_IN_ANY, headers=ALICE) as response:
        answer = await response.json()

    assert answer["error"]["code"] == -32700  # JSON-RPC's parse error
