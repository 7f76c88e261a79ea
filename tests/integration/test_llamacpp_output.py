"""Structured output against a real model server: llama.cpp (the `xllamacpp` wheel) serving
SmolLM2-135M-Instruct constrains its decoding to the agent's JSON Schema through OpenAI's
`response_format`, and the run completes with that JSON parsed and validated."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import nats
import pytest

from runbus.client import RunbusClient
from runbus.local_model import LocalModelServer, router_toml
from runbus.messages import ModelSettings, OutputFormat
from runbus_gateway.agents import AgentSpec
from runbus_model_router.config import parse_config
from tests.stack import SecuredNats, start_stack

pytestmark = [pytest.mark.timeout(120), pytest.mark.real_model]  # a llama.cpp server

PLACE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}
AGENT = AgentSpec(
    name="places",
    model="local",
    instructions="You answer with facts about cities.",
    model_settings=ModelSettings(max_output_tokens=80, temperature=0, seed=7),
    output_format=OutputFormat(name="place", schema=PLACE),
)


@pytest.fixture(scope="module")
def llama() -> Iterator[LocalModelServer]:
    with LocalModelServer(slots=1, threads=1) as server:
        yield server


async def test_the_real_model_answers_json_valid_for_the_agents_schema(
    nats_server: SecuredNats, tmp_path: Path, llama: LocalModelServer
) -> None:
    config = parse_config(router_toml(llama.base_url, target="retries = 0"))
    async with start_stack(
        nats_server.url, data_dir=tmp_path, agents={AGENT.name: AGENT}, router_config=config
    ):
        nc = await nats.connect(nats_server.url)
        try:
            done = await RunbusClient(nc, token="dev-alice").run(
                "places", "Tell me about Paris.", session_id="p", timeout=90
            )
        finally:
            await nc.drain()

    jsonschema.validate(done.output, PLACE)
    assert set(done.output) == {"city", "country", "population_millions"}
    assert len(done.response) == 1  # valid at once: no repair turn was needed
