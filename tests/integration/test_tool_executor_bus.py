"""The tool executor on a real nats-server, spoken to the way the gateway (or any NATS client)
does: raw JSON requests with run headers on `runbus.tools.<name>.invoke` and `runbus.tools.list`.
"""

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from opentelemetry import trace
from structlog.testing import capture_logs

from runbus import subjects
from runbus.bus import Bus
from runbus.headers import RunContext
from runbus.messages import FunctionCallContent, encode
from runbus.messages.tools import (
    ApprovalGrant,
    ToolInvoke,
    ToolInvoked,
    ToolList,
)
from runbus.ops import TOOL_INVOKE, TOOLS_LIST
from runbus.owners import Owner
from runbus_examples.travel import fare, ledger
from runbus_examples.travel import tools as travel
from runbus_gateway.approvals import Approvals
from runbus_gateway.ports import BusPorts
from runbus_tool_executor.calls import CALL_RECORD_DECODER, call_key
from runbus_tool_executor.catalog import entry_for
from runbus_tool_executor.documents import tools as documents
from runbus_tool_executor.registry import ToolRegistry
from runbus_tool_executor.service import ToolExecutorService
from runbus_tool_executor.store import open_stores
from tests.helpers import eventually, take_time
from tests.stack import SecuredNats

ALICE = RunContext(
    run_id="r-bus", session_id="s1", agent="travel", props={"user_id": "alice", "tenant": "acme"}
)

ops = ToolRegistry()
done: Counter[str] = Counter()
gates: dict[str, asyncio.Event] = {}
began: Counter[str] = Counter()


@ops.tool(side_effect=True, timeout=5.0)
async def charge(amount: int, ticket: str) -> dict[str, Any]:
    """Charge a card: waits for the test's gate named `ticket`, then charges."""
    if ticket in gates:
        await gates[ticket].wait()
    done["charge"] += 1
    return {"charged": amount, "ticket": ticket}


@ops.tool(side_effect=True, timeout=0.5)
async def charge_slowly(amount: int) -> dict[str, Any]:
    """Charge a card through a gateway that hangs."""
    await asyncio.Event().wait()
    done["charge_slowly"] += 1
    return {"charged": amount}


@ops.tool(timeout=0.3)
async def sleep_forever() -> str:
    """Never returns."""
    await asyncio.Event().wait()
    return "never"


@ops.tool(timeout=10.0)
async def work(ms: int) -> int:
    """Takes `ms` milliseconds."""
    began["work"] += 1
    await take_time(ms / 1000)
    return ms


@ops.tool(timeout=10.0)
async def fetch(ticket: str) -> str:
    """Reads something (no side effect): waits for the test's gate named `ticket`."""
    began["fetch"] += 1
    await gates[ticket].wait()
    return f"fetched {ticket}"


@ops.tool(tenants=["globex"])
def globex_only() -> str:
    """A tool for one tenant."""
    return "globex"


Start = Callable[..., Awaitable[ToolExecutorService]]


@pytest.fixture
async def start(nats_server: SecuredNats, tmp_path: Path) -> AsyncIterator[Start]:
    """Start a tool_executor replica on its own connection; stopped after the test."""
    async with AsyncExitStack() as stack:

        async def start_replica(*registries: ToolRegistry, **kwargs: Any) -> ToolExecutorService:
            nc = await nats.connect(nats_server.url)
            stack.push_async_callback(_close, nc)
            kwargs.setdefault("tool_root", tmp_path / "files")
            service = ToolExecutorService(nc, list(registries), **kwargs)
            await service.start()
            await nc.flush()  # its subscriptions reach the server before the test sends
            stack.push_async_callback(service.stop)
            return service

        yield start_replica


async def _close(nc: NATS) -> None:
    if not nc.is_closed:
        await nc.drain()


@pytest.fixture(autouse=True)
def _reset() -> None:
    done.clear()
    gates.clear()
    began.clear()


async def ask(nc: NATS, subject: str, data: bytes, ctx: RunContext, timeout: float = 5.0) -> Msg:
    """A request that waits out the moment after a replica starts in which nats-server may
    still answer "no responders" although the replica flushed its subscriptions."""
    return await eventually(
        lambda: nc.request(subject, data, timeout=timeout, headers=ctx.to_headers()),
        retrying=(nats.errors.NoRespondersError,),
        what=f"an answer on {subject}",
    )


async def invoke(
    nc: NATS,
    name: str,
    arguments: dict[str, Any],
    *,
    ctx: RunContext = ALICE,
    call_id: str = "call-1",
    approval: ApprovalGrant | None = None,
    timeout: float = 5.0,
) -> ToolInvoked:
    body = ToolInvoke(call_id=call_id, name=name, arguments=arguments, approval=approval)
    reply = await ask(nc, subjects.tool_invoke(name), encode(body), ctx, timeout)
    assert not (reply.headers or {}).get("rb-error"), reply.data
    return TOOL_INVOKE.family.decode_reply.decode(reply.data)


async def listed(nc: NATS, names: list[str] | None, ctx: RunContext = ALICE) -> dict[str, Any]:
    reply = await ask(nc, subjects.TOOLS_LIST, encode(ToolList(names=names)), ctx)
    return {t.name: t.parameters for t in TOOLS_LIST.decode_reply.decode(reply.data).tools}


def handled(service: ToolExecutorService) -> int:
    assert service._micro is not None
    return sum(e.num_requests for e in service._micro.stats().endpoints if e.name != "list")


async def test_the_model_books_for_the_signed_in_user_whatever_user_id_it_sends(
    start: Start, nc: NATS
) -> None:
    await start(travel)

    schema = (await listed(nc, ["create_booking"]))["create_booking"]
    reply = await invoke(
        nc, "create_booking", {"flight_id": "QF431-20260310", "user_id": "someone-else"}
    )

    assert "user_id" not in schema["properties"]
    assert schema["additionalProperties"] is False
    assert reply.outcome == "result"
    assert reply.result.result["passenger"] == "alice"
    assert reply.result.result["tenant"] == "acme"


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("get_weather", {"city": 5}, "city"),
        ("get_weather", {"city": "x" * 65}, "city"),
        ("search_flights", {"origin": "Perth", "destination": "Darwin", "date": "soon"}, "date"),
        ("create_booking", {"flight_id": "QF431-20260310", "seat": "roof"}, "seat"),
        ("read_document", {"path": "../../etc/passwd"}, "leaves the tool's folder"),
        ("read_document", {"path": "/etc/passwd"}, "relative"),
    ],
    ids=["wrong-type", "too-long", "bad-date", "not-allowed", "dot-dot", "absolute"],
)
async def test_invalid_arguments_come_back_as_a_result_the_model_reads(
    start: Start, nc: NATS, name: str, arguments: dict[str, Any], says: str
) -> None:
    await start(travel, documents)

    reply = await invoke(nc, name, arguments)

    assert reply.outcome == "result"
    assert reply.result.result is None
    assert reply.result.error is not None
    assert reply.result.error.startswith("invalid arguments")
    assert says in reply.result.error


async def test_a_body_naming_another_tool_than_its_subject_is_refused(
    start: Start, nc: NATS
) -> None:
    await start(travel)
    body = encode(ToolInvoke(call_id="c1", name="create_booking", arguments={}))

    reply = await ask(nc, subjects.tool_invoke("get_weather"), body, ALICE)

    assert reply.headers is not None
    assert reply.headers["rb-error"] == "bad_request"


async def test_a_dear_booking_waits_for_approval_and_runs_once_when_approved(
    start: Start, nc: NATS
) -> None:
    await start(travel)
    flight = next(
        f"QF{n}-20260310" for n in range(400, 800) if fare(f"QF{n}-20260310", "business") > 1000
    )
    arguments = {"flight_id": flight, "cabin": "business"}
    before = ledger.count(ALICE.run_id)

    asked = await invoke(nc, "create_booking", arguments, call_id="c-approve")
    assert asked.outcome == "approval_required"
    assert asked.approval is not None
    assert asked.approval.arguments == {**arguments, "seat": "any"}
    assert asked.approval.reason.endswith("over the A$1000 booking limit")
    assert ledger.count(ALICE.run_id) == before
    grant = ApprovalGrant(
        decision="approved", digest=asked.approval.digest, approver="bob", decided_at=time.time()
    )
    booked = await invoke(nc, "create_booking", arguments, call_id="c-approve", approval=grant)
    again = await invoke(nc, "create_booking", arguments, call_id="c-approve", approval=grant)

    assert booked.outcome == "result"
    assert booked.result.result["approved_by"] == "bob"
    assert again.replayed
    assert again.result == booked.result
    assert ledger.count(ALICE.run_id) == before + 1


async def test_a_denied_booking_tells_the_model_and_books_nothing(start: Start, nc: NATS) -> None:
    await start(travel)
    flight = next(
        f"JQ{n}-20260310" for n in range(400, 800) if fare(f"JQ{n}-20260310", "business") > 1000
    )
    arguments = {"flight_id": flight, "cabin": "business"}
    before = ledger.count()
    asked = await invoke(nc, "create_booking", arguments, call_id="c-deny")
    assert asked.approval is not None
    grant = ApprovalGrant(
        decision="denied", digest=asked.approval.digest, approver="bob", note="fly economy"
    )

    denied = await invoke(nc, "create_booking", arguments, call_id="c-deny", approval=grant)

    assert denied.outcome == "result"
    assert denied.result.error == "not run: bob denied approval (fly economy). Do not retry it."
    assert ledger.count() == before


async def test_a_booking_on_the_blocked_flight_terminates_the_loop_without_booking(
    start: Start, nc: NATS
) -> None:
    await start(travel)
    before = ledger.count()

    reply = await invoke(nc, "create_booking", {"flight_id": "VA823-20260310"})

    assert reply.outcome == "terminate"
    assert "VA823" in (reply.result.error or "")
    assert ledger.count() == before


async def test_a_call_retried_after_the_replica_that_ran_it_died_returns_the_recorded_result(
    start: Start, nc: NATS
) -> None:
    first = await start(ops)
    gates["t-1"] = asyncio.Event()
    # The caller gives up before the charge finishes: its reply goes nowhere.
    with pytest.raises(nats.errors.TimeoutError):
        await invoke(nc, "charge", {"amount": 40, "ticket": "t-1"}, timeout=0.2)
    gates["t-1"].set()
    await eventually(lambda: done["charge"] == 1)
    await _until_recorded(nc, ALICE.run_id, "call-1")
    second = await start(ops)
    await first.nc.close()  # the replica that ran the charge is gone, without a goodbye

    # As the gateway would: a request the server still routed to the dead connection times out
    # and is sent again, with the same call id.
    for _ in range(5):
        try:
            retried = await invoke(nc, "charge", {"amount": 40, "ticket": "t-1"}, timeout=1.0)
            break
        except nats.errors.TimeoutError:
            continue

    assert retried.replayed
    assert retried.result.result == {"charged": 40, "ticket": "t-1"}
    assert done["charge"] == 1
    assert handled(second) == 1


def gateway_ports(nc: NATS, request_timeout: float = 30.0) -> BusPorts:
    """The gateway's own way of calling tools (heartbeats, tries again), on `nc`."""
    bus = Bus(nc, trace.get_tracer("test"), request_timeout=request_timeout)
    return BusPorts(bus, cast(Approvals, None))  # these calls need no approval


async def test_a_side_effecting_call_whose_caller_left_runs_to_its_end_and_is_replayed(
    start: Start, nc: NATS
) -> None:
    replica = await start(ops)
    gates["t-left"] = asyncio.Event()
    ports = gateway_ports(nc)
    charge_call = FunctionCallContent(
        call_id="call-left", name="charge", arguments={"amount": 12, "ticket": "t-left"}
    )
    # Sent as a fresh call is: claimed without a lookup first.
    caller = asyncio.ensure_future(ports.invoke_tool(ALICE, charge_call, first_send=True))
    await eventually(lambda: handled(replica) == 1)
    # The gateway stops listening mid-charge (its process died, or it gave up): the replica's
    # next heartbeat finds nobody waiting and its request handler ends.
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await eventually(lambda: not replica._tasks, what="the handler gave up on its caller")
    assert done["charge"] == 0

    gates["t-left"].set()
    await _until_recorded(nc, ALICE.run_id, "call-left")
    repeated = await ports.invoke_tool(ALICE, charge_call)  # as the resumed run sends it

    assert done["charge"] == 1
    assert repeated.replayed
    assert repeated.result.result == {"charged": 12, "ticket": "t-left"}


async def test_a_call_whose_replica_died_is_sent_again_and_the_model_gets_the_result(
    start: Start, nc: NATS
) -> None:
    first = await start(ops)
    gates["t-died"] = asyncio.Event()
    # A short idle timeout: the gateway notices the silent replica within about a second.
    ports = gateway_ports(nc, request_timeout=1.0)
    fetch_call = FunctionCallContent(call_id="c-died", name="fetch", arguments={"ticket": "t-died"})
    sent: list[bool] = []

    async def seen(msg: Msg) -> None:
        sent.append(TOOL_INVOKE.family.decode.decode(msg.data).first_send)

    await nc.subscribe(subjects.tool_invoke("fetch"), cb=seen)
    pending = asyncio.ensure_future(ports.invoke_tool(ALICE, fetch_call, first_send=True))
    await eventually(lambda: began["fetch"] == 1)
    await start(ops)
    await first.nc.close()  # dies mid-call, without a goodbye
    gates["t-died"].set()  # the replica left standing answers at once

    reply = await pending

    assert reply.result.error is None
    assert reply.result.result == "fetched t-died"
    assert began["fetch"] >= 2  # a third try only if the survivor was slower than 1 s
    # Only the first try says it is one: the executor that got it may have claimed the call.
    assert sent[0] is True
    assert len(sent) >= 2
    assert not any(sent[1:])


async def test_a_tool_no_replica_serves_is_an_error_for_the_model_without_tries_again(
    nc: NATS,
) -> None:
    ports = gateway_ports(nc, request_timeout=1.0)
    with capture_logs() as logs:
        reply = await ports.invoke_tool(
            ALICE, FunctionCallContent(call_id="c-none", name="nobody_serves_this", arguments={})
        )

    assert reply.result.error == "no service answers on 'runbus.tools.nobody_serves_this.invoke'"
    assert not [e for e in logs if e["event"] == "tool_call_sent_again"]


@pytest.mark.slow
async def test_a_call_whose_replica_died_mid_call_is_reported_unknown_not_run_twice(
    start: Start, nc: NATS
) -> None:
    first = await start(ops)
    pending = asyncio.ensure_future(invoke(nc, "charge_slowly", {"amount": 7}, timeout=1.0))
    await eventually(lambda: handled(first) == 1)
    await first.nc.close()  # dies while the charge is in flight
    with pytest.raises(nats.errors.TimeoutError):
        await pending
    await start(ops)

    retried = await invoke(nc, "charge_slowly", {"amount": 7}, timeout=10)

    assert retried.result.error is not None
    assert retried.result.error.startswith("outcome unknown")
    assert done["charge_slowly"] == 0


async def test_a_tool_that_sleeps_forever_is_cut_at_its_timeout(start: Start, nc: NATS) -> None:
    await start(ops)
    started = time.monotonic()

    reply = await invoke(nc, "sleep_forever", {})

    assert time.monotonic() - started < 2
    assert reply.result.error == "tool 'sleep_forever' timed out after 0.3s."


async def test_a_cancel_published_for_the_run_stops_its_pending_calls(
    start: Start, nc: NATS
) -> None:
    await start(ops)
    started = time.monotonic()
    pending = asyncio.ensure_future(invoke(nc, "work", {"ms": 5000}))
    await eventually(lambda: began["work"] == 1)

    await nc.publish(subjects.run_cancel("acme", "alice", ALICE.run_id), b"")
    reply = await pending

    assert time.monotonic() - started < 3
    assert reply.result.error == "not finished: the run was cancelled."


async def test_two_deployments_of_two_replicas_each_share_their_tools_load(
    start: Start, nc: NATS
) -> None:
    travel_replicas = [await start(travel), await start(travel)]
    ops_replicas = [await start(ops), await start(ops)]

    calls = [invoke(nc, "work", {"ms": 20}, call_id=f"w{i}") for i in range(30)] + [
        invoke(nc, "get_weather", {"city": "Sydney"}, call_id=f"g{i}") for i in range(30)
    ]
    replies = await asyncio.gather(*calls)

    assert all(r.result.error is None for r in replies)
    # 30 calls at random between two members: each gets some unless p = 2 * 2**-30.
    assert all(handled(r) > 0 for r in travel_replicas + ops_replicas)
    assert sum(handled(r) for r in travel_replicas) == 30
    assert sum(handled(r) for r in ops_replicas) == 30


async def test_any_replica_lists_the_tools_of_every_deployment(start: Start, nc: NATS) -> None:
    await start(travel)
    await start(ops)
    wanted = ["get_weather", "work", "create_booking", "charge"]

    answers = [await listed(nc, wanted) for _ in range(8)]

    assert all(list(a) == wanted for a in answers)
    assert "user_id" not in answers[0]["create_booking"]["properties"]


async def test_a_tool_for_another_tenant_is_not_listed_for_this_one(start: Start, nc: NATS) -> None:
    await start(ops)
    globex = RunContext(
        run_id="r-g", agent="travel", props={"user_id": "carol", "tenant": "globex"}
    )

    assert "globex_only" not in await listed(nc, None)
    assert "globex_only" in await listed(nc, None, globex)
    refused = await invoke(nc, "globex_only", {})
    assert refused.result.error == "no tool named 'globex_only' is available to this run"


async def test_a_catalog_entry_nobody_refreshed_for_long_is_not_listed(
    start: Start, nc: NATS
) -> None:
    await start(travel)
    _, catalog = await open_stores(nc, replicas=1)
    await catalog.publish([entry_for(ops.tools["work"], now=time.time() - 3600)])

    assert "work" not in await listed(nc, ["get_weather", "work"])


async def _until_recorded(nc: NATS, run_id: str, call_id: str) -> None:
    kv = await nc.jetstream().key_value(subjects.TOOL_CALLS_BUCKET)

    async def done() -> bool:
        entry = await kv.get(call_key(Owner("acme", "alice"), run_id, call_id))
        return entry.value is not None and CALL_RECORD_DECODER.decode(entry.value).state == "done"

    await eventually(done, 5)
    entry = await kv.get(call_key(Owner("acme", "alice"), run_id, call_id))
    assert entry.value is not None
    assert CALL_RECORD_DECODER.decode(entry.value).result is not None
