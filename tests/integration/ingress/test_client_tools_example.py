"""The client-tools example (`examples/client_tools`) runs as its README says: its OpenAI SDK
client answers the scripted agent's call of its own tool, and the same run answers."""

import importlib.util
from pathlib import Path

from runbus_examples.scripted import load_scripts
from runbus_gateway.agents import load_agents
from tests.integration.ingress.conftest import ingress
from tests.stack import SecuredNats, start_stack

EXAMPLE = Path(__file__).parents[3] / "examples" / "client_tools"


async def test_the_client_tools_example_answers_with_what_the_clients_tool_returned(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("client_tools_example", EXAMPLE / "client.py")
    assert spec is not None
    assert spec.loader is not None
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    async with (
        start_stack(
            nats_server.url,
            data_dir=tmp_path,
            agents=load_agents(EXAMPLE / "agents"),
            scripts=load_scripts(EXAMPLE / "scripts.toml"),
        ),
        ingress(nats_server.url) as (base, _),
    ):
        answer = await client.ask(f"{base}/v1", "Weather here?")

    assert answer == 'Where you are: "18 degrees, light rain"'
