"""Agents as tools: a call of another agent is a child run on the bus — the same owner, its
parent in its record, one trace — whose answer is the call's result; its usage rolls up, a
cancel of the parent reaches it, and the depth limit is a typed error the model reads."""

import asyncio
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runbus import ops
from runbus.client import RunbusClient
from runbus.errors import RemoteError
from runbus.messages import (
    ChatMessage,
    HistoryLoad,
    RunCompleted,
    RunFailed,
    RunRequest,
    RunToolResult,
    TextContent,
    encode,
)
from runbus.messages.runs import RunCancel, RunGet, RunList, RunRecord
from runbus_gateway.run.agent_tools import MAX_DEPTH, child_run_id
from runbus_gateway.tenants import TenantLimits
from tests.helpers import eventually
from tests.multi_agent import AGENTS, USAGE, AgentsModel
from tests.stack import SecuredNats, Stack, start_stack


def stack(
    nats_server: SecuredNats,
    data_dir: Path,
    model: AgentsModel,
    *,
    processor: SpanProcessor | None = None,
    **gateway_options: object,
) -> AbstractAsyncContextManager[Stack]:
    return start_stack(
        nats_server.url,
        data_dir=data_dir,
        agents=AGENTS,
        routes={"agents": model},
        processor=processor,
        gateway_options={"ack_wait": 1.0, "stop_grace": 0.2, **gateway_options},
    )


async def final(client: RunbusClient, run_id: str) -> RunCompleted | RunFailed:
    async for item in client.follow(run_id, timeout=20):
        if isinstance(item.event, RunCompleted | RunFailed):
            return item.event
    raise AssertionError("no final event")


async def children(client: RunbusClient, run_id: str) -> Sequence[RunRecord]:
    listed = await client.call(ops.API_RUNS_LIST, RunList(parent_run_id=run_id))
    return listed.records


async def test_an_agent_called_as_a_tool_runs_as_a_child_run_whose_answer_is_the_result(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = AgentsModel()
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        ended = await final(alice, run_id)
        child = child_run_id(run_id, "c-ask")
        parent = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
        kids = await eventually(lambda: children(alice, run_id))
        history = await alice.call(ops.HISTORY_LOAD, HistoryLoad(session_id="trip"))
        results = [
            i.event async for i in alice.follow(run_id) if isinstance(i.event, RunToolResult)
        ]

    assert isinstance(ended, RunCompleted)
    answer = "QF1 09:00 for 'SYD to MEL on Friday'"
    assert ended.text == f"triage heard: {answer}"
    [record] = kids
    assert (record.run_id, record.agent, record.status) == (child, "flights", "completed")
    assert (record.parent_run_id, record.root_run_id, record.depth) == (run_id, run_id, 1)
    assert (record.tenant, record.user_id) == ("acme", "alice")
    assert record.session_id != "trip"  # a conversation of its own
    # One trace holds the parent and its child.
    assert record.trace_id
    assert record.trace_id == parent.trace_id
    # Two model calls of the parent and one of the child, all in the parent's usage.
    assert ended.usage == USAGE + USAGE + USAGE
    assert [r.result.result for r in results] == [answer]
    stored = [r.result for m in history.messages for r in m.function_results]
    assert stored == [answer]


async def test_cancelling_the_parent_cancels_the_child_it_waits_on(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = AgentsModel(hold={("flights", 0)})
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        await asyncio.wait_for(model.reached.wait(), 10)
        child = child_run_id(run_id, "c-ask")
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        ended, child_ended = await asyncio.gather(final(alice, run_id), final(alice, child))

    assert isinstance(ended, RunFailed)
    assert isinstance(child_ended, RunFailed)
    assert (ended.error.code, child_ended.error.code) == ("cancelled", "cancelled")


async def test_an_agent_calling_past_the_depth_limit_reads_a_typed_error_and_the_tree_answers(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = AgentsModel()
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("deep", "Go deep", session_id="deep")
        ended = await final(alice, run_id)
        listed = await alice.call(ops.API_RUNS_LIST, RunList(limit=100))

    assert isinstance(ended, RunCompleted)
    # The deepest child was refused its call; each parent answered with its child's answer.
    assert ended.text.count("deep heard: ") == MAX_DEPTH + 1
    assert "agent_call_depth: " in ended.text
    tree = sorted(r.depth for r in listed.records if r.root_run_id in (run_id, ""))
    assert tree == list(range(MAX_DEPTH + 1))


async def test_another_user_or_tenant_can_neither_list_cancel_nor_add_to_the_children_of_a_run(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = AgentsModel(hold={("flights", 0)})
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        await asyncio.wait_for(model.reached.wait(), 10)
        child = child_run_id(run_id, "c-ask")
        await eventually(lambda: children(alice, run_id))
        seen = {n: await children(users[n], run_id) for n in ("bob", "carol")}
        # Bob's own run naming alice's as its parent stays bob's: not under alice's run.
        forged = RunRequest(
            run_id="r-forged",
            agent="flights",
            session_id="forged",
            input=[ChatMessage(role="user", contents=[TextContent(text="hi")])],
            parent_run_id=run_id,
            root_run_id=run_id,
            depth=1,
        )
        await (
            users["bob"]
            .nc.jetstream()
            .publish(
                "runbus.runs.flights",
                encode(forged),
                headers={"rb-auth": "Bearer dev-bob", "Nats-Msg-Id": "r-forged"},
            )
        )
        bobs = await eventually(lambda: children(users["bob"], run_id))
        refused = {}
        for attacker in ("bob", "carol"):
            with pytest.raises(RemoteError) as cancel:
                await users[attacker].call(ops.API_RUNS_CANCEL, RunCancel(run_id=child))
            refused[attacker] = cancel.value.remote_code
        model.release.set()
        ended = await final(alice, run_id)
        alices = await children(alice, run_id)

    assert seen == {"bob": [], "carol": []}
    assert [r.run_id for r in bobs] == ["r-forged"]
    assert [r.run_id for r in alices] == [child]
    assert refused == {"bob": "not_found", "carol": "not_found"}
    assert isinstance(ended, RunCompleted)


async def test_a_child_taken_after_its_parent_was_cancelled_ends_cancelled_without_running(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    """A cancel of the parent that came before a replica took its child reached nobody: the
    child, admitted later, finds its parent's record and does not run."""
    alice = users["alice"]
    model = AgentsModel(hold={("flights", 0)})
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        await asyncio.wait_for(model.reached.wait(), 10)
        await alice.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
        await final(alice, run_id)
        asked = model.calls_of("flights")
        late = RunRequest(
            run_id="r-late-child",
            agent="flights",
            session_id="r-late-child",
            input=[ChatMessage(role="user", contents=[TextContent(text="SYD to MEL")])],
            parent_run_id=run_id,
            root_run_id=run_id,
            depth=1,
        )
        await alice.nc.jetstream().publish(
            "runbus.runs.flights",
            encode(late),
            headers={"rb-auth": "Bearer dev-alice", "Nats-Msg-Id": "r-late-child"},
        )
        ended = await final(alice, "r-late-child")

    assert isinstance(ended, RunFailed)
    assert ended.error.code == "cancelled"
    assert model.calls_of("flights") == asked


async def test_one_trace_holds_the_parent_its_tool_span_and_the_childs_spans(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    spans = InMemorySpanExporter()
    async with stack(nats_server, tmp_path, AgentsModel(), processor=SimpleSpanProcessor(spans)):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        await final(alice, run_id)
        child = child_run_id(run_id, "c-ask")

        def invoked() -> list[ReadableSpan]:
            found = [
                s
                for s in spans.get_finished_spans()
                if s.name.startswith("invoke_agent ")
                and s.attributes is not None
                and s.attributes.get("runbus.run_id") in (run_id, child)
            ]
            return found if len(found) == 2 else []

        agents = await eventually(invoked)
        [tool] = [s for s in spans.get_finished_spans() if s.name == "execute_tool flights"]

    by_run = {s.attributes["runbus.run_id"]: s for s in agents if s.attributes is not None}
    parent_span, child_span = by_run[run_id], by_run[child]
    assert child_span.context.trace_id == parent_span.context.trace_id
    assert tool.context.trace_id == parent_span.context.trace_id
    assert tool.parent is not None
    assert tool.parent.span_id == parent_span.context.span_id


async def test_another_user_publishing_a_childs_id_first_does_not_stop_the_child(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    """The child's id can be worked out; its request's dedupe key names the parent's
    credential, so bob's request of that id first is bob's own run, and alice's child runs."""
    alice, bob = users["alice"], users["bob"]
    model = AgentsModel(hold={("triage", 0)})
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        await asyncio.wait_for(model.reached.wait(), 10)
        child = child_run_id(run_id, "c-ask")
        squat = RunRequest(
            run_id=child,
            agent="flights",
            session_id="squat",
            input=[ChatMessage(role="user", contents=[TextContent(text="mine")])],
        )
        await bob.nc.jetstream().publish(
            "runbus.runs.flights",
            encode(squat),
            headers={"rb-auth": "Bearer dev-bob", "Nats-Msg-Id": child},
        )
        model.release.set()
        ended = await final(alice, run_id)
        kids = await children(alice, run_id)

    assert isinstance(ended, RunCompleted)
    assert ended.text == "triage heard: QF1 09:00 for 'SYD to MEL on Friday'"
    assert [(k.run_id, k.status) for k in kids] == [(child, "completed")]


async def test_a_parent_and_its_child_run_complete_under_a_tenant_limit_of_one(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    """A run waiting on its child gives its tenant lease back meanwhile: the child, of the same
    tenant, needs it to run at all."""
    alice = users["alice"]
    model = AgentsModel()
    async with stack(nats_server, tmp_path, model, tenant_limits=TenantLimits(default=1)):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        ended = await final(alice, run_id)
        [child] = await eventually(lambda: children(alice, run_id))

    assert isinstance(ended, RunCompleted)
    assert ended.text == "triage heard: QF1 09:00 for 'SYD to MEL on Friday'"
    assert child.status == "completed"


async def test_a_parent_waiting_on_its_child_reads_running_not_waiting_for_a_person(
    nats_server: SecuredNats, tmp_path: Path, users: dict[str, RunbusClient]
) -> None:
    alice = users["alice"]
    model = AgentsModel(hold={("flights", 0)})
    async with stack(nats_server, tmp_path, model):
        run_id = await alice.start("triage", "Get me to Melbourne", session_id="trip")
        await asyncio.wait_for(model.reached.wait(), 10)  # the child works, the parent waits
        waiting = (await alice.call(ops.API_RUNS_GET, RunGet(run_id=run_id))).record
        model.release.set()
        ended = await final(alice, run_id)

    assert waiting.status == "running"
    assert isinstance(ended, RunCompleted)
