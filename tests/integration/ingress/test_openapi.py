"""The OpenAPI document names exactly the routes the app serves, and schemathesis fuzzing every
operation from it finds no server error and no untyped error."""

import asyncio
import json
from typing import Any

import aiohttp
import pytest
import schemathesis
import schemathesis.specs.openapi.schemas
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error

from runbus_ingress.app import build_app
from tests.integration.ingress.conftest import ALICE

EXAMPLES_PER_OPERATION = 12
# schemathesis loads its OpenAPI module lazily, and the fuzzing runs in a worker thread: loaded
# (and assertion-rewritten by pytest) there, CPython 3.11 can fail the compile with
# "AST constructor recursion depth mismatch". Imported above, it is compiled at collection.


def test_the_document_names_exactly_the_routes_the_app_serves() -> None:
    app = build_app("nats://127.0.0.1:1")
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    from runbus_ingress.openapi import document

    doc = json.loads(document())
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}

    assert documented == served


def _typed_error(status: int, body: bytes) -> bool:
    """runbus's `{"type": "error", "error": {code, message}}` or OpenAI's `{"error": {...}}`."""
    try:
        error: dict[str, Any] = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error.get("code"), str) and isinstance(error.get("message"), str)


def _fuzz(base: str) -> list[str]:
    """Fuzz every operation; what went wrong, one line each."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    problems: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an invalid schema fails here

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case[Any]) -> None:
            response = case.call(base_url=base, headers=ALICE, timeout=15)
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except AssertionError as exc:
                problems.append(f"{case.method} {case.formatted_path}: {exc}")
            if response.status_code >= 400 and not _typed_error(
                response.status_code, response.content
            ):
                problems.append(
                    f"{case.method} {case.formatted_path}: untyped {response.status_code}"
                    f" {response.content[:200]!r}"
                )

        check()
    return problems


@pytest.mark.slow
# Bounded: 12 examples per operation, 15 s per request, a minute in all (about 12 s here).
@pytest.mark.timeout(60)
# Hypothesis warns, now and then, about a deprecated use inside schemathesis's strategies;
# that is the fuzzer's business, not a finding about the app (seen once in many runs).
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
async def test_fuzzing_every_route_finds_no_server_error_and_only_typed_errors(
    served: str, http: aiohttp.ClientSession
) -> None:
    async with http.get("/openapi.json") as response:
        doc = await response.json()
    # The fuzzer's HTTP client blocks: it runs in a thread while the ingress serves on this loop.
    problems = await asyncio.to_thread(_fuzz, served)

    assert doc["openapi"] == "3.1.0"
    assert problems == []
