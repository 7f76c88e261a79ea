"""A service's connection keeps a fixed set of subscriptions however much it sends: events
published without waiting (each used to leave nats-py's ack inbox subscribed behind it) and
progress-aware calls (each used to subscribe and unsubscribe an inbox of its own)."""

import asyncio

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StreamConfig
from opentelemetry.trace import NoOpTracer

from runbus.bus import Bus
from runbus.headers import RunContext
from runbus.messages import TextContent

DECODER = msgspec.json.Decoder(TextContent)
REPLY = TextContent(text="done")


def subscriptions(nc: NATS) -> int:
    return len(nc._subs)  # nats-py keeps no public count


async def test_sending_leaves_no_subscription_behind(nc: NATS) -> None:
    await nc.jetstream().add_stream(StreamConfig(name="SUBS_TEST", subjects=["subs.test.>"]))

    async def answer(msg: Msg) -> None:
        await msg.respond(msgspec.json.encode(REPLY))

    await nc.subscribe("subs.call", cb=answer)
    bus = Bus(nc, NoOpTracer())

    async def traffic(times: int) -> None:
        acks = [await bus.stream_publish_async(f"subs.test.{i}", b"{}", {}) for i in range(times)]
        await asyncio.gather(*acks)
        for _ in range(times):
            await bus.request("subs.call", REPLY, DECODER, ctx=RunContext(), progress=True)

    await traffic(1)  # the first of each makes the connection's one subscription for it
    before = subscriptions(nc)
    await traffic(30)

    assert subscriptions(nc) == before
