"""An agent called as a tool (a child run on the bus) against a native tool call on the same
run: a scripted agent making one tool call, once to a registry tool and once to another agent
(whose run makes one scripted model call and answers), runs interleaved A/B on one in-process
stack; p50 of each, their ratio, and what the child run adds next to a run of the called agent
on its own."""

import statistics
import tempfile
import time
from pathlib import Path

import nats
from tests.stack import start_stack

from bench.processes import OPEN_BUS_ALICE
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats
from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_gateway.agents import AgentSpec, AgentTool

RUNS = 100
WARM_UP = 10
AGENTS = {
    "native": AgentSpec(name="native", model="scripted/native", tools=["get_weather"]),
    "parent": AgentSpec(
        name="parent", model="scripted/parent", agent_tools=[AgentTool(agent="weather")]
    ),
    "weather": AgentSpec(name="weather", model="scripted/weather"),
}
SCRIPTS = {
    "native": [
        ScriptedReply(tool_calls=[ScriptedCall("get_weather", {"city": "Sydney"})]),
        ScriptedReply(text="{last_result}"),
    ],
    "parent": [
        ScriptedReply(tool_calls=[ScriptedCall("weather", {"input": "Weather in Sydney?"})]),
        ScriptedReply(text="{last_result}"),
    ],
    "weather": [ScriptedReply(text="Sydney: 24 degrees, light rain")],
}


async def run_benchmark(runs: int = RUNS) -> None:
    print(f"\n[child run] one tool call per run, native tool vs another agent, {runs} each")
    samples: dict[str, list[float]] = {"native": [], "parent": [], "weather": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        async with start_stack(server.url, data_dir=Path(tmp), agents=AGENTS, scripts=SCRIPTS):
            nc = await nats.connect(server.url)
            client = RunbusClient(nc, token="dev-alice", identity=OPEN_BUS_ALICE)
            try:
                for index in range(WARM_UP + runs):
                    for agent, kept in samples.items():
                        start = time.perf_counter()
                        done = await client.run(agent, "Go.", session_id=f"{agent}-{index}")
                        elapsed = (time.perf_counter() - start) * 1000
                        # The answer quotes the tool's result: the call was made and answered.
                        assert "Sydney" in done.text, done.text
                        if index >= WARM_UP:
                            kept.append(elapsed)
            finally:
                await nc.drain()
    native, child, alone = (statistics.median(samples[k]) for k in ("native", "parent", "weather"))
    print(
        f"  whole run, native tool       p50 {native:7.2f} ms\n"
        f"  whole run, agent as a tool   p50 {child:7.2f} ms   ratio {child / native:.2f}x\n"
        f"  the child run adds           p50 {child - native:7.2f} ms "
        f"(the called agent's own run, alone: p50 {alone:.2f} ms)"
    )
