"""An MCP stdio tool against a native one on the same run: a scripted agent making one tool
call, once to a registry tool and once to `mcp-server-time` (spawned by a tool_executor
replica), runs interleaved A/B on one in-process stack; p50 of each and their ratio."""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from tests.stack import start_stack

from bench.processes import OPEN_BUS_ALICE
from bench.results import McpTool, SectionNumbers
from bench.tools import request
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats
from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_gateway.agents import AgentSpec
from runbus_tool_executor.config import Deployment
from runbus_tool_executor.mcp_servers import McpServerConfig
from runbus_tool_executor.service import ToolExecutorService

RUNS = 100
WARM_UP = 10
TIME_SERVER = McpServerConfig(
    name="time",
    command=str(Path(sys.executable).parent / "mcp-server-time"),
    args=["--local-timezone", "UTC"],
)
AGENTS = {
    "native": AgentSpec(name="native", model="scripted/native", tools=["get_weather"]),
    "mcp": AgentSpec(name="mcp", model="scripted/mcp", tools=["time__get_current_time"]),
}
SCRIPTS = {
    "native": [
        ScriptedReply(tool_calls=[ScriptedCall("get_weather", {"city": "Sydney"})]),
        ScriptedReply(text="{last_result}"),
    ],
    "mcp": [
        ScriptedReply(
            tool_calls=[ScriptedCall("time__get_current_time", {"timezone": "Europe/Paris"})]
        ),
        ScriptedReply(text="{last_result}"),
    ],
}

EXPECTED = {"native": "Sydney", "mcp": "Europe/Paris"}
"""What each agent's answer (the tool's result) contains."""

CALLS = {
    "native": ("get_weather", {"city": "Sydney"}),
    "mcp": ("time__get_current_time", {"timezone": "Europe/Paris"}),
}
"""The same calls, made straight to `runbus.tools.<name>.invoke`."""


async def bare_calls(nc: NATS, n: int) -> dict[str, list[float]]:
    """Milliseconds of each bare call over the bus, the two kinds interleaved."""
    samples: dict[str, list[float]] = {"native": [], "mcp": []}
    for index in range(WARM_UP + n):
        for kind, (name, arguments) in CALLS.items():
            start = time.perf_counter()
            invoked = await request(nc, name, arguments, f"{kind}-{index}")
            elapsed = (time.perf_counter() - start) * 1000
            assert invoked.result.error is None, invoked.result.error
            if index >= WARM_UP:
                samples[kind].append(elapsed)
    return samples


async def run_benchmark(runs: int = RUNS) -> SectionNumbers:
    print(f"\n[mcp tool] one tool call per run, native vs mcp-server-time (stdio), {runs} each")
    samples: dict[str, list[float]] = {"native": [], "mcp": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        async with start_stack(
            server.url, data_dir=Path(tmp), agents=AGENTS, scripts=SCRIPTS
        ) as stack:
            await stack.start_service(
                ToolExecutorService, registries=[], deployment=Deployment(mcp_servers=[TIME_SERVER])
            )
            nc = await nats.connect(server.url)
            client = RunbusClient(nc, token="dev-alice", identity=OPEN_BUS_ALICE)
            try:
                calls = await bare_calls(nc, 10 * runs)
                for index in range(WARM_UP + runs):
                    for agent, kept in samples.items():
                        start = time.perf_counter()
                        done = await client.run(agent, "Go.", session_id=f"{agent}-{index}")
                        elapsed = (time.perf_counter() - start) * 1000
                        # The answer quotes the tool's result: the call was made and answered.
                        assert EXPECTED[agent] in done.text, done.text
                        if index >= WARM_UP:
                            kept.append(elapsed)
            finally:
                await nc.drain()
    native, mcp = statistics.median(samples["native"]), statistics.median(samples["mcp"])
    result = McpTool(
        runs=runs,
        native_p50_ms=native,
        mcp_p50_ms=mcp,
        ratio=mcp / native,
        call_native_p50_ms=statistics.median(calls["native"]),
        call_mcp_p50_ms=statistics.median(calls["mcp"]),
    )
    print(
        f"  tools.<name>.invoke on the bus, native p50 {result.call_native_p50_ms:7.3f} ms   "
        f"MCP p50 {result.call_mcp_p50_ms:7.3f} ms ({10 * runs} calls each)"
    )
    print(
        f"  whole run, native tool   p50 {native:7.2f} ms\n"
        f"  whole run, MCP stdio     p50 {mcp:7.2f} ms   ratio {result.ratio:.2f}x "
        "(target <= 2x)"
    )
    return SectionNumbers(mcp_tool=result)
