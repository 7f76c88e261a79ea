"""Large content travels by reference: stored once, never inside a bus message, resolved only
where the bytes are needed (the model router)."""

import os
from pathlib import Path

import msgspec
import nats

from runbus import blobs, ops
from runbus.client import RunbusClient
from runbus.messages import ChatMessage, DataContent, HistoryLoad, TextContent, UriContent
from runbus_examples import AGENTS_DIR
from runbus_gateway.agents import load_agents
from tests.models import GatedModel, text
from tests.stack import SecuredNats, start_stack

AGENTS = {"travel": msgspec.structs.replace(load_agents(AGENTS_DIR)["travel"], model="gated")}


async def test_a_two_megabyte_image_reaches_the_model_but_no_message_carries_it(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    image = os.urandom(2 * 1024 * 1024)  # twice NATS's default max payload
    model = GatedModel(lambda request, step: text("A photo of a beach."))
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents=AGENTS, routes={"gated": model}
    ):
        nc = await nats.connect(nats_server.url)
        client = RunbusClient(nc, token="dev-alice")
        question = ChatMessage(
            role="user",
            contents=[
                TextContent(text="Where is this?"),
                DataContent(data=image, media_type="image/png"),
            ],
        )
        done = await client.run("travel", [question], session_id="photo")
        again = await client.run("travel", [question], session_id="photo")
        loaded = await client.call(ops.HISTORY_LOAD, HistoryLoad(session_id="photo"))
        stored = await blobs.get(nc, loaded.messages[0].contents[1].uri)  # type: ignore[union-attr]
        await nc.drain()

    assert done.text == again.text == "A photo of a beach."
    [seen] = [p for p in model.requests[0].messages[-1].contents if isinstance(p, DataContent)]
    assert seen.data == image
    reference = loaded.messages[0].contents[1]
    assert isinstance(reference, UriContent)
    assert reference.uri.startswith("runbus-blob://")
    assert reference.media_type == "image/png"
    assert loaded.messages[2].contents[1] == reference  # the same bytes are stored once
    assert stored == image
    assert max(len(msgspec.json.encode(m)) for m in loaded.messages) < 4096
