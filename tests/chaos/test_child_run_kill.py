"""A gateway dies while a parent run waits on its child (an agent called as a tool): another
replica resumes both, the parent completes once, and the child's answer is its call's result
once — whether the gateway died while the child worked or after it answered and before the
parent stored that answer."""

import asyncio
from pathlib import Path

import nats
import pytest

from runbus import ops
from runbus.client import RunbusClient
from runbus.messages import HistoryLoad, RunCompleted, RunFailed, RunToolResult
from runbus.messages.runs import RunList
from runbus.tokens import TokenVerifier
from runbus_gateway.run.agent_tools import child_run_id
from runbus_gateway.service import GatewayService
from tests.chaos.conftest import ChaosReport
from tests.multi_agent import AGENTS, AgentsModel
from tests.stack import SecuredNats, start_stack

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
