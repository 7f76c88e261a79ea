"""The structured-output and output-guardrails examples (`examples/structured_output`,
`examples/output_guardrails`) run as their READMEs say, on their scripted models."""

from pathlib import Path

import nats
import pytest

from runbus.client import RunbusClient, RunFailedError
from runbus_examples.scripted import load_scripts
from runbus_gateway.agents import load_agents
from tests.stack import SecuredNats, start_stack

EXAMPLES = Path(__file__).parents[2] / "examples"


async def test_the_structured_output_example_answers_json_of_its_schema(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    example = EXAMPLES / "structured_output"
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=load_agents(example / "agents"),
        scripts=load_scripts(example / "scripts.toml"),
    ):
        nc = await nats.connect(nats_server.url)
        try:
            done = await RunbusClient(nc, token="dev-alice").run(
                "trip", "Two days in Kyoto, please.", session_id="trip"
            )
        finally:
            await nc.drain()

    assert done.output == {
        "city": "Kyoto",
        "days": 2,
        "stops": ["Fushimi Inari", "Arashiyama", "Gion"],
    }


async def test_the_output_guardrails_example_answers_one_and_blocks_the_other(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    example = EXAMPLES / "output_guardrails"
    async with start_stack(
        nats_server.url,
        data_dir=tmp_path,
        agents=load_agents(example / "agents"),
        scripts=load_scripts(example / "scripts.toml"),
    ):
        nc = await nats.connect(nats_server.url)
        client = RunbusClient(nc, token="dev-alice")
        try:
            done = await client.run("concierge", "When is breakfast?", session_id="c1")
            with pytest.raises(RunFailedError) as blocked:
                await client.run("leaky", "What's the door code?", session_id="c2")
        finally:
            await nc.drain()

    assert done.text.startswith("Breakfast is served")
    assert blocked.value.known_code == "output_blocked"
    assert blocked.value.message == "I can't share that."
