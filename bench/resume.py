"""Time to resume a run whose gateway died mid-run: the gateway process SIGKILLed and a new one
started (the deployment shape, the gateway's real ack_wait), and the same in one process with
the ack_wait lowered, which shows what resuming costs beyond waiting for the redelivery."""

import itertools
import statistics
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

import nats
from tests.stack import start_stack

from bench import slow_tools
from bench.processes import OPEN_BUS_ALICE, Bench
from bench.results import InProcessResume, ProcessResume
from runbus.client import RunbusClient, open_connection
from runbus.embedded import EmbeddedNats
from runbus.messages import RunCompleted, RunFailed, RunToolCall
from runbus.tokens import TokenVerifier
from runbus_examples.scripted import ScriptedCall, ScriptedReply
from runbus_examples.travel import tools as travel_tools
from runbus_gateway.agents import AgentSpec
from runbus_gateway.service import ACK_WAIT, GatewayService

TOKEN = "dev-alice"
TOOL_SECONDS = 0.3
ids = itertools.count()


async def processes(bench: Bench) -> ProcessResume:
    """Kill (SIGKILL) the only gateway while a run waits on a 1 s tool; start a new gateway
    at once, as an orchestrator would; the time from the kill to `run.completed`. The run
    comes back when JetStream redelivers it, `ack_wait` after the last `in_progress`."""
    assert len(bench.gateways) == 1, "the killed gateway must be the one running the run"
    nc = await open_connection(bench.url, TOKEN)
    client = RunbusClient(nc, token=TOKEN)
    killed_at = ready_at = 0.0
    try:
        events = client.stream("resume", "Wait.", session_id=f"rs-{next(ids)}")
        async with aclosing(events):
            async for event in events:
                if isinstance(event, RunToolCall) and not killed_at:
                    victim = bench.gateways.pop()
                    victim.kill()
                    killed_at = time.perf_counter()
                    await victim.wait()
                    await bench.add_gateway()
                    ready_at = time.perf_counter()
                if isinstance(event, RunFailed):
                    raise AssertionError(f"resumed run failed: {event.error}")
                if isinstance(event, RunCompleted):
                    assert "Resumed" in event.text, event.text
                    break
        done_at = time.perf_counter()
    finally:
        await nc.drain()
    return ProcessResume(
        kill_to_completed_s=done_at - killed_at,
        new_gateway_ready_s=ready_at - killed_at,
        ack_wait_s=ACK_WAIT,
    )


async def in_process(ack_wait: float, trials: int) -> InProcessResume:
    """`trials` runs, each losing its gateway (its connection closed: no ack, no cleanup reaches
    NATS) while a TOOL_SECONDS tool runs, a new replica up first; the kill → `run.completed`."""
    agent = AgentSpec(
        name="resume",
        instructions="Wait, then answer.",
        model="scripted/resume",
        tools=["wait_a_moment"],
    )
    script = [
        ScriptedReply(tool_calls=[ScriptedCall("wait_a_moment", {"seconds": TOOL_SECONDS})]),
        ScriptedReply(text="Resumed: {last_result}"),
    ]
    # A server of its own: the run consumer's ack_wait is the last started gateway's.
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "js") as server:
        samples = await _kill_and_resume(server.url, Path(tmp), ack_wait, trials, agent, script)
    return InProcessResume(
        ack_wait_s=ack_wait,
        tool_s=TOOL_SECONDS,
        kill_to_completed_s=statistics.median(samples),
        trials=samples,
    )


async def _kill_and_resume(
    url: str,
    data_dir: Path,
    ack_wait: float,
    trials: int,
    agent: AgentSpec,
    script: list[ScriptedReply],
) -> list[float]:
    gateway = {"agents": {"resume": agent}, "verifier": TokenVerifier.from_file()}
    samples = []
    async with start_stack(
        url,
        data_dir=data_dir,
        agents={"resume": agent},
        scripts={"resume": script},
        tool_registries=[travel_tools, slow_tools.tools],
        gateway_options={"ack_wait": ack_wait},
    ) as stack:
        nc = await nats.connect(url)
        client = RunbusClient(nc, token=TOKEN, identity=OPEN_BUS_ALICE)
        for _ in range(trials):
            killed_at = 0.0
            events = client.stream("resume", "Wait.", session_id=f"ri-{next(ids)}")
            async with aclosing(events):
                async for event in events:
                    if isinstance(event, RunToolCall) and not killed_at:
                        # The only replica runs it; a new one comes up, then the old one dies.
                        doomed = stack.services["gateway"]
                        stack.services["gateway"] = await stack.start_service(
                            GatewayService, ack_wait=ack_wait, **gateway
                        )
                        await doomed.nc.close()
                        killed_at = time.perf_counter()
                    if isinstance(event, RunFailed):
                        raise AssertionError(f"resumed run failed: {event.error}")
                    if isinstance(event, RunCompleted):
                        break
            samples.append(time.perf_counter() - killed_at)
        await nc.drain()
    return samples
