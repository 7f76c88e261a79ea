"""The router over the bus with OpenAI-compatible targets: a loopback provider speaking the real
wire format (SSE streaming included), so the production client code path is what runs."""

import asyncio
import base64

import msgspec
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus import subjects
from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    DataContent,
    FunctionCallContent,
    FunctionResultContent,
    ReasoningContent,
    RunTextDelta,
    TextContent,
    ToolSpec,
    Usage,
)
from runbus.messages.runs import RUN_EVENT_DECODER
from runbus.service import DEFAULT_OPTIONS, ServiceOptions
from runbus.telemetry import create_tracer_provider
from tests.helpers import eventually
from tests.integration.model_provider import (
    CTX,
    Reply,
    answer,
    ask,
    chunk,
    loopback,
    refusal,
    router,
    text_reply,
    tool_reply,
    usage_chunk,
    user,
)
from tests.stack import SecuredNats

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
PNG = DataContent(data=b"\x89PNG\r\n\x1a\n" + bytes(64), media_type="image/png")


def one_route(url: str, **target: object) -> str:
    extra = "".join(f"{k} = {msgspec.json.encode(v).decode()}\n" for k, v in target.items())
    return f"""
[backends.lb]
base_url = "{url}"
[routes.cheap]
[[routes.cheap.targets]]
backend = "lb"
model = "small-1"
input_price = 1.0
output_price = 2.0
{extra}"""


async def test_tool_calls_parallel_calls_and_usage_round_trip_through_the_openai_backend(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        provider.script(
            tool_reply(
                [
                    ("c-1", "get_weather", '{"city": "Sydney"}'),
                    ("c-2", "get_weather", '{"city": "Perth"}'),
                ],
                usage=(120, 30),
            ),
            text_reply("Sunny in both.", usage=(200, 5)),
        )
        request = ask("Weather in Sydney and Perth?", tools=[WEATHER], message_id="r-model-m0")

        first = await answer(nc, request)
        prompt = [
            *request.messages,
            first.message,
            ChatMessage(
                role="tool",
                contents=[
                    FunctionResultContent(call_id="c-1", result={"temperature_c": 24}),
                    FunctionResultContent(call_id="c-2", result={"temperature_c": 31}),
                ],
            ),
        ]
        second = await answer(nc, msgspec.structs.replace(request, messages=prompt))

    assert first.finish_reason == "tool_calls"
    assert first.message.function_calls == [
        FunctionCallContent(call_id="c-1", name="get_weather", arguments={"city": "Sydney"}),
        FunctionCallContent(call_id="c-2", name="get_weather", arguments={"city": "Perth"}),
    ]
    assert first.message.message_id == "r-model-m0"
    assert first.usage == Usage(input_tokens=120, output_tokens=30)
    assert first.route == "cheap"
    assert first.cost == (120 * 1.0 + 30 * 2.0) / 1e6
    assert second.message.text == "Sunny in both."
    sent = provider.requests[0]
    assert sent["model"] == "small-1"
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["parallel_tool_calls"] is True
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    followup = provider.requests[1]["messages"]
    assert [m["role"] for m in followup] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in followup[1]["tool_calls"]] == ["c-1", "c-2"]
    assert followup[2] == {
        "role": "tool",
        "tool_call_id": "c-1",
        "content": '{"temperature_c": 24}',
    }


async def test_text_deltas_reach_a_bus_subscriber_before_the_provider_has_finished(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        slow = text_reply("One two three four.", pause_after=1)
        provider.script(slow)
        events = await nc.subscribe(subjects.events("acme", "alice", "r-model"))
        request = ask(
            "Count", stream_to=subjects.events("acme", "alice", "r-model"), message_id="r-model-m0"
        )

        pending = asyncio.ensure_future(answer(nc, request))
        first = RUN_EVENT_DECODER.decode((await events.next_msg(timeout=10)).data)
        finished_before = provider.finished
        slow.resume.set()
        response = await pending
        rest = [RUN_EVENT_DECODER.decode((await events.next_msg(timeout=5)).data) for _ in range(3)]
        await events.unsubscribe()

    assert finished_before == 0
    deltas = [first, *rest]
    assert all(isinstance(d, RunTextDelta) for d in deltas)
    assert [d.message_id for d in deltas if isinstance(d, RunTextDelta)] == ["r-model-m0"] * 4
    text = "".join(d.delta for d in deltas if isinstance(d, RunTextDelta))
    assert text == response.message.text == "One two three four."


async def test_a_cheap_by_default_request_with_an_image_is_answered_by_the_vision_target(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback("cheap") as cheap, loopback("vision") as vision:
        routes = f"""
[backends.cheap]
base_url = "{cheap.base_url}"
[backends.vision]
base_url = "{vision.base_url}"
family = "vision-family"
[routes.cheap]
reroute = ["vision"]
[[routes.cheap.targets]]
backend = "cheap"
model = "small-1"
[routes.vision]
[[routes.vision.targets]]
backend = "vision"
model = "eyes-1"
images = true
"""
        async with router(nats_server.url, routes):
            response = await answer(
                nc,
                msgspec.structs.replace(
                    ask("What is in it?"), messages=[user(TextContent(text="What is in it?"), PNG)]
                ),
            )

    assert response.route == "vision"
    assert cheap.requests == []
    (sent,) = vision.requests
    assert sent["model"] == "eyes-1"
    image = sent["messages"][0]["content"][1]
    assert image["type"] == "image_url"
    assert image["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")


async def test_with_the_placeholder_policy_a_text_only_target_gets_a_note_naming_the_image(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider:
        routes = one_route(provider.base_url).replace(
            "[routes.cheap]\n", '[routes.cheap]\nunsupported = "placeholder"\n'
        )
        async with router(nats_server.url, routes):
            await answer(
                nc,
                msgspec.structs.replace(ask("x"), messages=[user(TextContent(text="See: "), PNG)]),
            )

    content = provider.requests[0]["messages"][0]["content"]
    assert isinstance(content, str)
    assert content.startswith("See: [image omitted: image/png, 72 bytes")


async def test_with_no_capable_target_the_caller_gets_a_typed_error_and_no_provider_is_asked(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        error = await refusal(nc, msgspec.structs.replace(ask("x"), messages=[user(PNG)]))
        after = await answer(nc, ask("still there?"))

    assert error.code == "unsupported_request"
    assert "images" in error.details["needs"]
    assert len(provider.requests) == 1
    assert after.message.text


async def test_invalid_tool_arguments_go_back_to_the_model_and_its_corrected_call_is_returned(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        provider.script(
            tool_reply(
                [
                    ("c-1", "get_weather", "{'city': Sydney}"),
                    ("c-2", "get_weather", '{"city": "Perth"}'),
                ]
            ),
            tool_reply(
                [
                    ("c-3", "get_weather", '{"city": "Sydney"}'),
                    ("c-4", "get_weather", '{"city": "Perth"}'),
                ]
            ),
        )

        response = await answer(nc, ask("Weather?", tools=[WEATHER]))

    assert [c.arguments for c in response.message.function_calls] == [
        {"city": "Sydney"},
        {"city": "Perth"},
    ]
    assert response.usage == Usage(input_tokens=40, output_tokens=18)
    repair = provider.requests[1]["messages"]
    assert [m["role"] for m in repair] == ["user", "assistant", "tool", "tool"]
    assert "not a valid JSON object" in repair[2]["content"]
    assert "{'city': Sydney}" in repair[2]["content"]
    assert repair[2]["tool_call_id"] == "c-1"
    assert repair[3]["content"].startswith("Error: Not run")


async def test_arguments_still_unreadable_after_the_repair_turn_give_a_typed_error(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        provider.script(*(tool_reply([("c", "get_weather", "city=Sydney")]) for _ in range(2)))

        error = await refusal(nc, ask("Weather?", tools=[WEATHER]))
        after = await answer(nc, ask("Hello?"))

    assert error.code == "invalid_tool_arguments"
    assert "city=Sydney" in error.message
    assert len(provider.requests) == 3
    assert after.message.text == "Hello from the loopback provider."


async def test_a_malformed_tool_schema_is_refused_before_any_provider_request(
    nats_server: SecuredNats, nc: NATS
) -> None:
    broken = ToolSpec(name="get_weather", description="", parameters={"type": "array"})
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        error = await refusal(nc, ask("Weather?", tools=[broken]))

    assert error.code == "invalid_tool_schema"
    assert error.details["tool"] == "get_weather"
    assert provider.requests == []


async def test_reasoning_goes_back_to_the_family_that_wrote_it_and_is_dropped_for_another(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback("thinker") as thinker, loopback("plain") as plain:
        routes = f"""
[backends.thinker]
base_url = "{thinker.base_url}"
family = "deepseek"
reasoning_field = "reasoning_content"
[backends.plain]
base_url = "{plain.base_url}"
family = "openai"
[routes.think]
[[routes.think.targets]]
backend = "thinker"
model = "r1"
[routes.plain]
[[routes.plain.targets]]
backend = "plain"
model = "gpt"
"""
        thinker.script(
            Reply(
                chunks=[
                    chunk(extra={"reasoning_content": "Sydney is in NSW."}),
                    chunk(content="Sydney.", finish_reason="stop"),
                    usage_chunk(10, 5),
                ]
            )
        )
        async with router(nats_server.url, routes) as service:
            first = await answer(nc, ask("Capital?", route="think", message_id="r-model-m0"))
            assert service.provenance is not None
            await service.provenance.close()  # the provenance write is in the bucket
            service.provenance.cache.clear()  # as if another replica answers next
            history = [*ask("Capital?").messages, first.message, user(TextContent(text="Sure?"))]
            await answer(nc, msgspec.structs.replace(ask("", route="think"), messages=history))
            await answer(nc, msgspec.structs.replace(ask("", route="plain"), messages=history))

    assert first.message.contents[0] == ReasoningContent(text="Sydney is in NSW.")
    back_to_thinker = thinker.requests[1]["messages"][1]
    assert back_to_thinker["reasoning_content"] == "Sydney is in NSW."
    to_plain = plain.requests[0]["messages"][1]
    assert to_plain == {"role": "assistant", "content": "Sydney."}


async def test_each_call_is_a_chat_span_naming_the_provider_and_its_usage(
    nats_server: SecuredNats, nc: NATS
) -> None:
    spans = InMemorySpanExporter()
    provider_traces = create_tracer_provider(
        "model_router", processors=[SimpleSpanProcessor(spans)]
    )
    async with (
        loopback() as provider,
        router(
            nats_server.url,
            one_route(provider.base_url),
            options=ServiceOptions(tracer_provider=provider_traces),
        ),
    ):
        await answer(nc, ask("hi"), CTX)

    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]
    attributes = dict(chat.attributes or {})
    assert chat.name == "chat small-1"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.response.model"] == "loopback-1"
    assert attributes["gen_ai.response.id"] == "chatcmpl-loopback"  # the provider's own id
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == provider.port
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        11,
        7,
    )


async def test_a_server_answering_the_whole_completion_at_once_is_read_too(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        whole = tool_reply([("c-1", "get_weather", '{"city": "Sydney"}')], usage=(50, 8))
        whole.whole = True
        provider.script(whole)

        response = await answer(nc, ask("Weather?", tools=[WEATHER]))

    assert response.finish_reason == "tool_calls"
    assert response.message.function_calls == [
        FunctionCallContent(call_id="c-1", name="get_weather", arguments={"city": "Sydney"})
    ]
    assert response.usage == Usage(input_tokens=50, output_tokens=8)


async def test_calls_one_after_another_reuse_one_connection_to_the_provider(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        for index in range(3):
            await answer(nc, ask(f"call {index}"))

    assert len(provider.requests) == 3
    assert provider.connections == 1


async def test_calls_in_flight_at_once_each_get_a_connection_and_later_calls_reuse_them(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        held = asyncio.Event()  # every reply waits after its headers until all 20 are in
        provider.default = lambda: text_reply("ok then", pause_after=0, resume=held)
        runs = [RunContext(run_id=f"r-{i}", props={"tenant": "acme"}) for i in range(20)]
        first = [asyncio.ensure_future(answer(nc, ask("hi"), ctx)) for ctx in runs]
        await eventually(lambda: provider.in_flight == 20, what="20 calls in flight")
        held.set()
        await asyncio.gather(*first)
        await asyncio.gather(*(answer(nc, ask("again"), ctx) for ctx in runs))

    assert provider.finished == 40
    assert provider.connections == 20


async def test_a_replica_serves_more_model_calls_at_once_than_the_services_default(
    nats_server: SecuredNats, nc: NATS
) -> None:
    calls = DEFAULT_OPTIONS.max_concurrency + 44
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        held = asyncio.Event()
        provider.default = lambda: text_reply("ok then", pause_after=0, resume=held)
        runs = [RunContext(run_id=f"r-{i}", props={"tenant": "acme"}) for i in range(calls)]
        waiting = [asyncio.ensure_future(answer(nc, ask("hi"), ctx)) for ctx in runs]
        await eventually(lambda: provider.in_flight == calls, what=f"{calls} calls in flight")
        held.set()
        await asyncio.gather(*waiting)

    assert provider.finished == calls


@pytest.fixture
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


async def test_a_backend_is_called_through_the_http_proxy_the_environment_names(
    nats_server: SecuredNats, nc: NATS, no_proxy_environment: pytest.MonkeyPatch
) -> None:
    # The loopback provider answers a proxied request (its absolute URL) as its own.
    async with loopback() as proxy:
        no_proxy_environment.setenv("HTTP_PROXY", f"http://team:s3cret@127.0.0.1:{proxy.port}")
        async with router(nats_server.url, one_route("http://model.invalid/v1")):
            response = await answer(nc, ask("hi"))

    assert response.message.text == "Hello from the loopback provider."
    assert proxy.paths == ["http://model.invalid/v1/chat/completions"]
    [headers] = proxy.headers
    assert headers["proxy-authorization"] == "Basic " + base64.b64encode(b"team:s3cret").decode()


async def test_an_https_backends_credential_never_reaches_the_proxy_it_tunnels_through(
    nats_server: SecuredNats, nc: NATS, no_proxy_environment: pytest.MonkeyPatch
) -> None:
    tunnels: list[str] = []

    async def refuse_tunnel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tunnels.append((await reader.readuntil(b"\r\n\r\n")).decode().lower())
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    proxy = await asyncio.start_server(refuse_tunnel, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    no_proxy_environment.setenv("HTTPS_PROXY", f"http://team:s3cret@127.0.0.1:{port}")
    no_proxy_environment.setenv("MODEL_KEY", "sk-very-secret")
    routes = one_route("https://model.invalid/v1", retries=0).replace(
        "[routes.cheap]\n", 'api_key_env = "MODEL_KEY"\n[routes.cheap]\n'
    )
    try:
        async with router(nats_server.url, routes):
            error = await refusal(nc, ask("hi"))
    finally:
        proxy.close()

    assert error.code == "model_unavailable"
    assert tunnels
    for tunnel in tunnels:
        assert tunnel.startswith("connect model.invalid:443 ")
        assert "sk-very-secret" not in tunnel
        assert "proxy-authorization: basic " in tunnel


async def test_a_backend_on_a_host_no_proxy_names_is_called_directly(
    nats_server: SecuredNats, nc: NATS, no_proxy_environment: pytest.MonkeyPatch
) -> None:
    no_proxy_environment.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing answers there
    no_proxy_environment.setenv("NO_PROXY", "127.0.0.1")
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        response = await answer(nc, ask("hi"))

    assert response.message.text == "Hello from the loopback provider."
    assert provider.paths == ["/v1/chat/completions"]


async def test_a_backends_own_headers_reach_the_provider_and_replace_ours_by_name(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider:
        routes = one_route(provider.base_url).replace(
            "[routes.cheap]\n",
            '[backends.lb.headers]\nX-Team = "travel"\nAuthorization = "Bearer gateway-key"\n'
            "[routes.cheap]\n",
        )
        async with router(nats_server.url, routes):
            await answer(nc, ask("hi"))

    [headers] = provider.headers
    assert headers["x-team"] == "travel"
    assert headers["authorization"] == "Bearer gateway-key"
