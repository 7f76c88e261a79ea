"""The router sends a request's output format to an OpenAI-compatible target as OpenAI's own
`response_format`, over the real wire format (a loopback provider)."""

from nats.aio.client import Client as NATS

from runbus.messages import OutputFormat
from tests.integration.model_provider import answer, ask, loopback, router, text_reply, tool_reply
from tests.integration.test_model_router_openai import one_route
from tests.stack import SecuredNats

TRIP = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


async def test_an_output_format_goes_out_as_json_schema_or_json_object(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with loopback() as provider, router(nats_server.url, one_route(provider.base_url)):
        provider.script(text_reply('{"city": "Kyoto"}'), text_reply("{}"), text_reply("Hi"))
        await answer(nc, ask("Plan", response_format=OutputFormat(name="trip", schema=TRIP)))
        await answer(nc, ask("Plan", response_format=OutputFormat(strict=False)))
        await answer(nc, ask("Plan"))

    assert provider.requests[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "trip", "schema": TRIP, "strict": True},
    }
    assert provider.requests[1]["response_format"] == {"type": "json_object"}
    assert "response_format" not in provider.requests[2]


async def test_a_target_without_native_output_gets_it_as_a_final_result_tool_answered_as_text(
    nats_server: SecuredNats, nc: NATS
) -> None:
    async with (
        loopback() as provider,
        router(nats_server.url, one_route(provider.base_url, native_output=False)),
    ):
        provider.script(tool_reply([("c-1", "final_result", '{"city": "Kyoto"}')]))
        reply = await answer(
            nc, ask("Plan", response_format=OutputFormat(name="trip", schema=TRIP))
        )

    sent = provider.requests[0]
    assert "response_format" not in sent
    assert [t["function"]["name"] for t in sent["tools"]] == ["final_result"]
    assert sent["tools"][0]["function"]["parameters"] == TRIP
    assert reply.finish_reason == "stop"
    assert reply.message.function_calls == []
    assert reply.message.text == '{"city": "Kyoto"}'
