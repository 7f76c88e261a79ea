"""A gateway dies while a parent run waits on its child (an agent called as a tool): another
replica resumes both, the parent completes once, and the child's answer is its call's result
once — whether the gateway died while the child worked or after it answered and before the
parent stored that answer."""

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, RunCompleted, RunFailed, RunToolResult
from runbus.messages.runs import RunList
from runbus.settings import load_settings
from runbus.supervisor import ProcessStack
from runbus.tokens import TokenVerifier
from runbus_gateway.run.agent_tools import child_run_id
from runbus_gateway.service import GatewayService
from tests.chaos.conftest import ChaosReport
from tests.helpers import eventually
from tests.integration.model_provider import Reply, chunk, loopback, usage_chunk
from tests.multi_agent import AGENTS, AgentsModel
from tests.stack import SecuredNats, service_url, start_stack

ACK_WAIT = 1.0
CASES = {
    "child working": ("flights", 0),
    "child answered, parent not yet stored it": ("triage", 1),
}


@pytest.mark.parametrize("case", CASES)
async def test_a_gateway_killed_around_a_child_run_completes_the_parent_once_with_one_answer(
    case: str, nats_server: SecuredNats, tmp_path: Path, chaos_report: ChaosReport
) -> None:
    model = AgentsModel(hold={CASES[case]})
    nc = await nats.connect(nats_server.url)
    alice = RunbusClient(nc, token="dev-alice")
    try:
        async with start_stack(
            nats_server.url,
            data_dir=tmp_path,
            agents=AGENTS,
            routes={"agents": model},
            gateway_options={"ack_wait": ACK_WAIT},
        ) as stack:
            run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
            await asyncio.wait_for(model.reached.wait(), 10)
            doomed = stack.services["gateway"]
            await stack.start_service(
                GatewayService,
                agents=AGENTS,
                verifier=TokenVerifier.from_file(),
                ack_wait=ACK_WAIT,
            )
            model.hold.clear()
            await doomed.nc.close()  # the replica vanishes: no ack, no cleanup reaches NATS
            model.release.set()

            events = [i.event async for i in alice.follow(run_id, timeout=30)]
            child = child_run_id(run_id, "c-ask")
            child_finals = [
                i.event
                async for i in alice.follow(child, timeout=30)
                if isinstance(i.event, RunCompleted | RunFailed)
            ]
            kids = await alice.call(ops.API_RUNS_LIST, RunList(parent_run_id=run_id))
            history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip"))
    finally:
        await nc.drain()

    finals = [e for e in events if isinstance(e, RunCompleted | RunFailed)]
    results = [e.result.result for e in events if isinstance(e, RunToolResult)]
    stored = [r.result for m in history.messages for r in m.function_results]
    chaos_report.record(
        "child runs: gateway killed",
        {
            "case": case,
            "parent finals": len(finals),
            "child finals": len(child_finals),
            "children": len(kids.records),
            "answers stored": len(stored),
            "flights model calls": model.calls_of("flights"),
        },
    )
    answer = "QF1 09:00 for 'SYD to MEL on Friday'"
    assert [type(f) for f in finals] == [RunCompleted]
    assert isinstance(finals[0], RunCompleted)
    assert finals[0].text == f"triage heard: {answer}"
    assert [type(f) for f in child_finals] == [RunCompleted]
    assert [r.run_id for r in kids.records] == [child]
    assert stored == [answer]
    assert set(results) == {answer}
    if case == "child answered, parent not yet stored it":
        assert model.calls_of("flights") == 1  # found, not asked again


# -- the same with processes: the gateway SIGKILLed and started again --------------------------

AGENT_FILES = {
    "triage": """
name = "triage"
instructions = "You are triage."
model = "agents"
[[agent_tools]]
agent = "flights"
""",
    "flights": """
name = "flights"
instructions = "You are flights."
model = "agents"
""",
}
ROUTES = """
[backends.loopback]
base_url = "{base_url}"
[routes.agents]
[[routes.agents.targets]]
backend = "loopback"
model = "loopback-1"
retries = 0
"""


def agents_reply(request: dict[str, Any], held: Reply | None) -> Reply:
    """As the agent whose instructions open the prompt: triage asks flights (the same call id
    every time, as a checkpointed call keeps it), then answers with its result; flights
    answers, the first time held until the test lets it go."""
    messages = request["messages"]
    agent = messages[0]["content"].removeprefix("You are ").split(".")[0]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if agent == "flights":
        reply = held or Reply()
        reply.chunks = [chunk(content="QF1 09:00"), chunk(finish_reason="stop")]
    elif not results:
        call = {"name": "flights", "arguments": json.dumps({"input": "SYD to MEL"})}
        tool_call = {"index": 0, "id": "c-ask", "type": "function", "function": call}
        reply = Reply(chunks=[chunk(tool_calls=[tool_call]), chunk(finish_reason="tool_calls")])
    else:
        reply = Reply(
            chunks=[chunk(content=f"triage heard: {results[-1]}"), chunk(finish_reason="stop")]
        )
    reply.chunks.append(usage_chunk(10, 5))
    return reply


async def test_a_gateway_sigkilled_while_a_child_run_works_completes_the_parent_once(
    tmp_path: Path, chaos_report: ChaosReport
) -> None:
    held = Reply(pause_after=0)
    firsts = [held]
    async with loopback("agents") as provider:
        provider.default = lambda: agents_reply(
            provider.requests[-1],
            firsts.pop() if _is_flights(provider.requests[-1]) and firsts else None,
        )
        (tmp_path / "agents").mkdir()
        for name, text in AGENT_FILES.items():
            (tmp_path / "agents" / f"{name}.toml").write_text(text)
        (tmp_path / "routes.toml").write_text(ROUTES.format(base_url=provider.base_url))
        env = {
            "RUNBUS_DATA_DIR": str(tmp_path),
            "RUNBUS_AGENTS_DIR": str(tmp_path / "agents"),
            "RUNBUS_MODEL_ROUTES": str(tmp_path / "routes.toml"),
            "RUNBUS_EMBEDDER": "hashing",
            "RUNBUS_LOG_LEVEL": "warning",
            "RUNBUS_LOG_FORMAT": "json",
            "RUNBUS_RUN_ACK_WAIT": "3",
        }
        with pytest.MonkeyPatch.context() as patch:
            for variable in [v for v in os.environ if v.startswith("RUNBUS_")]:
                patch.delenv(variable)
            for variable, value in env.items():
                patch.setenv(variable, value)
            stack = ProcessStack(load_settings(), nats_port=0)
            url = await stack.start(timeout=60)
        try:
            nc = await nats.connect(service_url(url, stack.data))
            alice = RunbusClient(nc, token="dev-alice")
            try:
                run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
                await eventually(lambda: any(map(_is_flights, provider.requests)), timeout=30)
                await stack.kill("gateway")  # the parent and its child both on it, mid-child
                held.resume.set()
                await stack.restart("gateway", timeout=60)

                events = [i.event async for i in alice.follow(run_id, timeout=60)]
                child = child_run_id(run_id, "c-ask")
                child_finals = [
                    i.event
                    async for i in alice.follow(child, timeout=60)
                    if isinstance(i.event, RunCompleted | RunFailed)
                ]
                history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip"))
            finally:
                await nc.close()
        finally:
            await stack.stop()

    finals = [e for e in events if isinstance(e, RunCompleted | RunFailed)]
    stored = [r.result for m in history.messages for r in m.function_results]
    triage_asked = sum(
        1 for r in provider.requests if not _is_flights(r) and r["messages"][-1]["role"] == "user"
    )
    chaos_report.record(
        "child runs: gateway SIGKILLed",
        {
            "parent finals": len(finals),
            "child finals": len(child_finals),
            "answers stored": len(stored),
            "triage asked the model for the call": triage_asked,
        },
    )
    assert [type(f) for f in finals] == [RunCompleted]
    assert isinstance(finals[0], RunCompleted)
    assert finals[0].text == "triage heard: QF1 09:00"
    assert [type(f) for f in child_finals] == [RunCompleted]
    assert stored == ["QF1 09:00"]
    assert triage_asked == 1  # the checkpointed call was not asked for again


def _is_flights(request: dict[str, Any]) -> bool:
    return str(request["messages"][0]["content"]).startswith("You are flights")
