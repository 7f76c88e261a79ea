"""The multi-agent example (`examples/multi_agent`) runs as its README says: triage asks the
flights agent (a child run with its own tool) and the remote rates agent (an a2a-sdk server)
at once, and answers; the child run is listed under it."""

import importlib.util
from pathlib import Path

import msgspec
import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import RunToolResult
from runbus.messages.runs import RunList
from runbus_examples.scripted import load_scripts
from runbus_gateway.agents import load_agents
from tests.stack import SecuredNats, start_stack

EXAMPLE = Path(__file__).parents[2] / "examples" / "multi_agent"


async def test_the_multi_agent_example_asks_a_child_run_and_a_remote_a2a_agent(
    nats_server: SecuredNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("rates_agent", EXAMPLE / "rates_agent.py")
    assert spec is not None
    assert spec.loader is not None
    rates = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rates)
    monkeypatch.setenv("RATES_TOKEN", "example-token")
    agents = load_agents(EXAMPLE / "agents")
    alice = RunbusClient(await nats.connect(nats_server.url), token="dev-alice")
    try:
        async with rates.serving("example-token") as url:
            # The file names port 9999; the test's server listens on a free one.
            [remote] = agents["triage"].remote_agents
            agents["triage"] = msgspec.structs.replace(
                agents["triage"], remote_agents=[msgspec.structs.replace(remote, url=url)]
            )
            async with start_stack(
                nats_server.url,
                data_dir=tmp_path,
                agents=agents,
                scripts=load_scripts(EXAMPLE / "scripts.toml"),
            ):
                done = await alice.run(
                    "triage", "Flights to Melbourne, and the rate?", session_id="trip"
                )
                results = [
                    i.event.result
                    async for i in alice.follow(done.run_id)
                    if isinstance(i.event, RunToolResult)
                ]
                children = await alice.call(ops.API_RUNS_LIST, RunList(parent_run_id=done.run_id))
    finally:
        await alice.nc.drain()

    assert done.text == 'Both specialists answered; the last said: "1 AUD = 0.6500 USD"'
    flights, fx = results
    assert isinstance(flights.result, str)
    assert flights.result.startswith("Cheapest first: [")
    assert fx.result == "1 AUD = 0.6500 USD"
    [child] = children.records
    assert (child.agent, child.status, child.depth) == ("flights", "completed", 1)
