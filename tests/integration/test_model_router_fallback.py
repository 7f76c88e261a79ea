"""Resilience over the bus against loopback providers: retries honouring `Retry-After`, fallback
on 5xx, 429, timeouts and connection errors, circuit breakers, the concurrency cap, cancel."""

import asyncio
import socket
import time

from nats.aio.client import Client as NATS

from runbus import subjects
from runbus.headers import RunContext
from tests.helpers import eventually
from tests.integration.model_provider import (
    LLAMACPP_CONTEXT_ERROR,
    Reply,
    answer,
    ask,
    chunk,
    complete,
    loopback,
    refusal,
    router,
    status_reply,
    text_reply,
)
from tests.stack import SecuredNats


def two_targets(primary: str, fallback: str, **limits: object) -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in limits.items())
    return f"""
[backends.primary]
base_url = "{primary}"
[backends.fallback]
base_url = "{fallback}"
[routes.cheap]
[[routes.cheap.targets]]
backend = "primary"
model = "first"
backoff = 0.01
{extra}
[[routes.cheap.targets]]
backend = "fallback"
model = "second"
"""


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_primary_answering_500_falls_back_to_the_next_target(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(500), status_reply(503))
        fallback.default = lambda: text_reply("from the fallback")
        async with router(nats_server.url, two_targets(primary.base_url, fallback.base_url)):
            response = await answer(nc, ask("hi"))

    assert response.message.text == "from the fallback"
    assert len(primary.requests) == 2  # the first try and one retry
    assert len(fallback.requests) == 1


async def test_a_429_with_retry_after_is_retried_on_the_same_target_after_that_wait(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(429, {"Retry-After": "0.3"}))
        async with router(nats_server.url, two_targets(primary.base_url, fallback.base_url)):
            response = await answer(nc, ask("hi"))

    assert response.message.text == "Hello from the loopback provider."
    assert len(primary.requests) == 2
    assert fallback.requests == []
    assert primary.arrivals[1] - primary.arrivals[0] >= 0.3


async def test_a_retry_after_beyond_the_limit_moves_on_to_the_next_target_at_once(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(429, {"Retry-After": "3600"}))
        routes = two_targets(primary.base_url, fallback.base_url, max_retry_after=5)
        async with router(nats_server.url, routes):
            await asyncio.wait_for(answer(nc, ask("hi")), 10)

    assert len(primary.requests) == 1
    assert len(fallback.requests) == 1


async def test_a_primary_that_times_out_falls_back(nats_server: SecuredNats, nc: NATS) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(Reply(delay=5, chunks=[chunk(content="late")]))
        routes = two_targets(primary.base_url, fallback.base_url, timeout=0.3, retries=0)
        async with router(nats_server.url, routes):
            response = await answer(nc, ask("hi"))

    assert response.message.text == "Hello from the loopback provider."
    assert len(fallback.requests) == 1


async def test_a_primary_that_refuses_connections_falls_back(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as fallback:
        routes = two_targets(f"http://127.0.0.1:{closed_port()}/v1", fallback.base_url)
        async with router(nats_server.url, routes):
            response = await answer(nc, ask("hi"))

    assert response.message.text == "Hello from the loopback provider."


async def test_a_model_server_that_is_down_is_named_with_its_url_and_setting(
    nats_server: SecuredNats, nc: NATS
) -> None:
    down = f"http://127.0.0.1:{closed_port()}/v1"
    routes = two_targets(down, down, retries=0)
    async with router(nats_server.url, routes):
        error = await refusal(nc, ask("hi"))

    assert (
        f"model server at {down} (a backend's base_url in RUNBUS_MODEL_ROUTES) does not answer: "
        "connection refused"
    ) in error.message


async def test_a_stream_that_is_not_json_counts_as_a_failure_and_falls_back(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(Reply(raw=["<html>gateway error</html>"]), Reply(raw=["{oops"]))
        async with router(nats_server.url, two_targets(primary.base_url, fallback.base_url)):
            response = await answer(nc, ask("hi"))

    assert response.message.text == "Hello from the loopback provider."
    assert len(primary.requests) == 2


async def test_a_request_the_provider_refuses_as_bad_is_not_sent_elsewhere(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(400))
        async with router(nats_server.url, two_targets(primary.base_url, fallback.base_url)):
            error = await refusal(nc, ask("hi"))

    assert error.code == "model_error"
    assert error.details["status"] == 400
    assert fallback.requests == []


async def test_a_retry_that_would_outlast_the_runs_deadline_moves_on_at_once(
    nats_server: SecuredNats, nc: NATS
) -> None:
    soon = RunContext(run_id="r-soon", props={"tenant": "acme"}, deadline=time.time() + 3)
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(503, {"Retry-After": "20"}))
        routes = two_targets(primary.base_url, fallback.base_url, max_retry_after=60)
        async with router(nats_server.url, routes):
            response = await answer(nc, ask("hi"), soon)

    assert response.message.text == "Hello from the loopback provider."
    assert len(primary.requests) == 1


async def test_when_every_target_fails_the_caller_gets_model_unavailable_with_each_reason(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(500), status_reply(500))
        fallback.script(status_reply(401))
        async with router(nats_server.url, two_targets(primary.base_url, fallback.base_url)):
            error = await refusal(nc, ask("hi"))
            after = await answer(nc, ask("again"))

    assert error.code == "model_unavailable"
    assert [a.split(":")[0] for a in error.details["attempts"]] == [
        "primary/first",
        "primary/first",
        "fallback/second",
    ]
    assert "HTTP 401" in error.details["attempts"][2]
    assert after.message.text


async def test_a_provider_failing_mid_stream_is_not_replaced_by_another_models_answer(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(
            Reply(chunks=[chunk(content="Half an "), {"error": {"message": "overloaded"}}])
        )
        routes = two_targets(primary.base_url, fallback.base_url)
        async with router(nats_server.url, routes):
            error = await refusal(nc, ask("hi", stream_to="runbus.events.acme.alice.r-model"))

    assert error.code == "model_error"
    assert "mid-stream" in error.message
    assert fallback.requests == []


async def test_the_breaker_opens_after_n_failures_and_closes_after_the_cooldown(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(status_reply(500), status_reply(500))
        routes = two_targets(
            primary.base_url, fallback.base_url, retries=0, breaker_failures=2, breaker_cooldown=0.5
        )
        async with router(nats_server.url, routes) as service:
            for _ in range(2):
                await answer(nc, ask("hi"))
            breaker = service.router.guards["primary/first"].breaker  # type: ignore[union-attr]
            assert breaker.state == "open"
            await answer(nc, ask("while open"))
            skipped = len(primary.requests)
            await eventually(lambda: breaker.state == "half_open")  # the cooldown is over
            probe = await answer(nc, ask("after the cooldown"))
            closed = breaker.state
            await answer(nc, ask("closed again"))

    assert skipped == 2, "an open circuit sends nothing to the target"
    assert len(fallback.requests) == 3
    assert probe.message.text == "Hello from the loopback provider."
    assert closed == "closed"
    assert len(primary.requests) == 4


async def test_fifty_concurrent_calls_never_exceed_the_targets_cap_of_four(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider:
        provider.default = lambda: text_reply("ok then", chunk_delay=0.005)
        routes = f"""
[backends.lb]
base_url = "{provider.base_url}"
[routes.cheap]
[[routes.cheap.targets]]
backend = "lb"
model = "capped"
concurrency = 4
"""
        async with router(nats_server.url, routes):
            runs = [RunContext(run_id=f"r-{i}", props={"tenant": "acme"}) for i in range(50)]
            responses = await asyncio.gather(
                *(answer(nc, ask(f"call {i}"), ctx) for i, ctx in enumerate(runs))
            )

    assert len(responses) == 50
    assert all(r.message.text == "ok then" for r in responses)
    assert provider.finished == 50
    assert provider.max_in_flight == 4


async def test_a_cancelled_run_stops_its_stream_and_gets_a_typed_error(
    nats_server: SecuredNats, nc: NATS
) -> None:
    run = RunContext(run_id="r-cancel", props={"tenant": "acme", "user_id": "alice"})
    other = RunContext(run_id="r-other", props={"tenant": "acme", "user_id": "alice"})
    not_theirs = RunContext(run_id="r-cancel", props={"tenant": "globex", "user_id": "bob"})
    async with (
        loopback() as provider,
        router(nats_server.url, two_targets(provider.base_url, provider.base_url)),
    ):
        stuck = text_reply("never finished", pause_after=1)
        provider.script(stuck)
        pending = asyncio.ensure_future(
            complete(nc, ask("hi", stream_to=subjects.events("acme", "alice", "r-cancel")), run)
        )
        await asyncio.wait_for(provider.first_chunk_sent.wait(), 10)

        await nc.publish(subjects.run_cancel("acme", "alice", "r-cancel"), b"")
        error = await pending
        await asyncio.wait_for(provider.client_left.wait(), 10)
        again = await refusal(nc, ask("and again?"), run)
        unaffected = await answer(nc, ask("other run"), other)
        same_id_other_owner = await answer(nc, ask("another owner's run"), not_theirs)

    assert getattr(error, "code", None) == "cancelled"
    assert provider.disconnected == 1
    assert again.code == "cancelled"
    assert len(provider.requests) == 3, "the cancelled run's next call never reached the provider"
    assert unaffected.message.text == "Hello from the loopback provider."
    assert same_id_other_owner.message.text == "Hello from the loopback provider."


async def test_a_prompt_too_long_for_the_primary_goes_to_the_next_target_without_a_retry(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(Reply(status=400, body=LLAMACPP_CONTEXT_ERROR))
        routes = two_targets(primary.base_url, fallback.base_url, retries=2, breaker_failures=1)
        async with router(nats_server.url, routes) as service:
            response = await answer(nc, ask("a long conversation"))
            breaker = service.router.guards["primary/first"].breaker  # type: ignore[union-attr]

    assert response.message.text == "Hello from the loopback provider."
    assert len(primary.requests) == 1
    assert len(fallback.requests) == 1
    assert breaker.state == "closed", "a prompt too long says nothing about the target's health"


async def test_a_prompt_too_long_for_every_target_fails_with_a_message_saying_what_to_do(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary, loopback() as fallback:
        primary.script(Reply(status=400, body=LLAMACPP_CONTEXT_ERROR))
        fallback.script(Reply(status=400, body=LLAMACPP_CONTEXT_ERROR))
        async with router(nats_server.url, two_targets(primary.base_url, fallback.base_url)):
            error = await refusal(nc, ask("a long conversation"))

    assert error.code == "context_too_long"
    assert error.message.startswith(
        "the prompt is too long for model 'second' (5012 tokens; it holds 4096)"
    )
    assert "compaction" in error.message
    assert (error.details["prompt_tokens"], error.details["context_tokens"]) == (5012, 4096)


async def test_a_target_that_is_down_after_one_too_small_gives_model_unavailable(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as primary:
        primary.script(Reply(status=400, body=LLAMACPP_CONTEXT_ERROR))
        down = f"http://127.0.0.1:{closed_port()}/v1"
        async with router(nats_server.url, two_targets(primary.base_url, down)):
            error = await refusal(nc, ask("a long conversation"))

    assert error.code == "model_unavailable"
    assert "exceeds the available context" not in error.message
    assert error.details["attempts"][0].startswith("primary/first: the prompt is too long")


async def test_the_targets_timeout_bounds_each_silence_not_the_whole_stream(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider:
        # Fifteen chunks 0.1 s apart outlast the 1 s timeout; no silence reaches it.
        provider.script(text_reply(" ".join(["word"] * 15), chunk_delay=0.1))
        routes = two_targets(provider.base_url, provider.base_url, timeout=1, retries=0)
        async with router(nats_server.url, routes):
            started = time.monotonic()
            response = await answer(nc, ask("a long answer"))
            took = time.monotonic() - started

    assert response.message.text == " ".join(["word"] * 15)
    assert took > 1
    assert len(provider.requests) == 1


async def test_a_stream_that_goes_silent_past_the_timeout_is_cut_and_its_connection_closed(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider:
        provider.script(text_reply("never finished", pause_after=1))
        routes = two_targets(provider.base_url, provider.base_url, timeout=0.5, retries=0)
        async with router(nats_server.url, routes):
            error = await refusal(nc, ask("hi"))
            await asyncio.wait_for(provider.client_left.wait(), 10)

    assert error.code == "model_error"
    assert "mid-stream: no answer within 0.5s" in error.message
    assert len(provider.requests) == 1, "no fallback once text went out"
