"""The executor without a bus: the middleware chain, approval, terminate, at-most-once runs of
side-effecting calls, timeouts, deadlines and cancellation."""

import asyncio
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
import pytest
from structlog.testing import capture_logs

from runbus.headers import RunContext
from runbus.messages import FunctionResultContent
from runbus.messages.tools import ApprovalGrant, ToolInvoke, ToolInvoked
from runbus.owners import Owner
from runbus_tool_executor.calls import CallRecord, MemoryCallStore, call_key
from runbus_tool_executor.executor import LEASE_GRACE, Executor
from runbus_tool_executor.middleware import (
    PROCEED,
    Call,
    Decision,
    Modify,
    Reject,
    RequireApproval,
    Terminate,
    approval_digest,
)
from runbus_tool_executor.registry import FromProp, ToolContext, ToolRegistry
from tests.helpers import eventually, take_time

ALICE = RunContext(
    run_id="r-1", session_id="s1", agent="travel", props={"user_id": "alice", "tenant": "acme"}
)
ran: Counter[str] = Counter()
contexts: list[ToolContext] = []
registry = ToolRegistry()


def over_100(arguments: Mapping[str, Any]) -> str | None:
    return f"{arguments['amount']} is over 100" if arguments["amount"] > 100 else None


@registry.tool(side_effect=True, approval=over_100)
def pay(
    amount: Annotated[int, msgspec.Meta(ge=1, le=10_000)],
    payer: Annotated[str, FromProp("user_id")],
    context: ToolContext,
    memo: str = "",
) -> dict[str, Any]:
    """Pay someone from the signed-in user's account."""
    ran["pay"] += 1
    contexts.append(context)
    return {"amount": amount, "payer": payer, "memo": memo}


@registry.tool(side_effect=True, idempotent=True)
def upsert(value: str) -> str:
    """Write a value; writing it twice is harmless."""
    ran["upsert"] += 1
    return value


@registry.tool()
async def lookup(term: str) -> str:
    """Look a term up."""
    ran["lookup"] += 1
    return term.upper()


@registry.tool(timeout=0.2)
async def hang() -> str:
    """Never answers."""
    await asyncio.Event().wait()
    return "never"


release = threading.Event()


@registry.tool(timeout=0.2)
def hang_in_a_thread() -> str:
    """Blocks its thread until the test lets go."""
    release.wait(10)
    return "late"


@registry.tool(timeout=5.0)
async def slow(seconds: float) -> str:
    """Takes its time."""
    ran["slow"] += 1
    await take_time(seconds)
    return "done"


@registry.tool(side_effect=True, timeout=5.0)
async def transfer(seconds: float) -> str:
    """Moves money, taking its time."""
    ran["transfer"] += 1
    await take_time(seconds)
    ran["transferred"] += 1
    return "transferred"


@registry.tool(agents=["billing"], tenants=["acme"])
def invoice() -> str:
    """Only for the billing agent of acme."""
    return "invoice"


def executor(*middleware: Any, store: MemoryCallStore | None = None) -> Executor:
    return Executor(middleware=middleware, calls=store or MemoryCallStore())


async def call(
    ex: Executor,
    name: str,
    arguments: dict[str, Any],
    *,
    ctx: RunContext = ALICE,
    call_id: str = "call-1",
    approval: ApprovalGrant | None = None,
    first_send: bool = False,
) -> ToolInvoked:
    request = ToolInvoke(
        call_id=call_id, name=name, arguments=arguments, approval=approval, first_send=first_send
    )
    reply = await ex.invoke(registry.tools[name], request, ctx)
    assert reply.result.call_id == call_id
    return reply


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    contexts.clear()


def blocked_memo(call: Call) -> Decision:
    if call.arguments.get("memo") == "stop":
        return Terminate(error="the memo says stop")
    if call.arguments.get("memo") == "no":
        return Reject(error="memos may not say no")
    return PROCEED


async def test_a_call_the_chain_lets_through_runs_with_the_trusted_identity() -> None:
    reply = await call(executor(blocked_memo), "pay", {"amount": 5, "payer": "mallory"})

    assert reply.outcome == "result"
    assert reply.result.result == {"amount": 5, "payer": "alice", "memo": ""}
    assert reply.untrusted
    assert not reply.replayed


async def test_a_rejected_call_does_not_run_and_the_model_reads_why() -> None:
    reply = await call(executor(blocked_memo), "pay", {"amount": 5, "memo": "no"})

    assert reply.outcome == "result"
    assert reply.result.error == "memos may not say no"
    assert ran["pay"] == 0


async def test_a_terminated_call_does_not_run_and_says_the_loop_stops() -> None:
    reply = await call(executor(blocked_memo), "pay", {"amount": 5, "memo": "stop"})

    assert reply.outcome == "terminate"
    assert reply.result.error == "the memo says stop"
    assert ran["pay"] == 0


async def test_a_modified_call_runs_with_the_new_arguments_validated_again() -> None:
    def polite(call: Call) -> Decision:
        return Modify({**call.arguments, "memo": "thanks"})

    def seen_by_the_next(call: Call) -> Decision:
        assert call.arguments["memo"] == "thanks"
        return PROCEED

    reply = await call(executor(polite, seen_by_the_next), "pay", {"amount": 5})

    assert reply.result.result["memo"] == "thanks"


async def test_a_modification_that_breaks_the_schema_is_refused_not_run() -> None:
    def broken(call: Call) -> Decision:
        return Modify({**call.arguments, "amount": -1})

    reply = await call(executor(broken), "pay", {"amount": 5})

    assert "policy made the call invalid" in (reply.result.error or "")
    assert ran["pay"] == 0


async def test_a_modification_cannot_set_an_injected_identity() -> None:
    def impersonate(call: Call) -> Decision:
        return Modify({**call.arguments, "payer": "mallory"})

    reply = await call(executor(impersonate), "pay", {"amount": 5})

    assert reply.result.result["payer"] == "alice"


async def test_a_middleware_that_raises_fails_closed() -> None:
    def broken(call: Call) -> Decision:
        raise RuntimeError("policy database down")

    with capture_logs() as logs:
        reply = await call(executor(broken), "pay", {"amount": 5})

    assert "policy check failed" in (reply.result.error or "")
    assert ran["pay"] == 0
    assert any(e["event"] == "tool_middleware_failed" for e in logs)


async def test_a_middleware_that_returns_something_else_fails_closed() -> None:
    def confused(call: Call) -> Any:
        return "yes please"

    reply = await call(executor(confused), "pay", {"amount": 5})

    assert reply.result.error is not None
    assert ran["pay"] == 0


async def test_async_middleware_is_awaited() -> None:
    async def later(call: Call) -> Decision:
        await asyncio.sleep(0)
        return Reject(result={"skipped": True})

    reply = await call(executor(later), "lookup", {"term": "x"})

    assert reply.result.result == {"skipped": True}
    assert reply.result.error is None
    assert ran["lookup"] == 0


async def test_a_call_over_the_tools_limit_asks_for_approval_without_running() -> None:
    reply = await call(executor(), "pay", {"amount": 500})

    assert reply.outcome == "approval_required"
    assert ran["pay"] == 0
    assert reply.approval is not None
    assert reply.approval.tool == "pay"
    assert reply.approval.arguments == {"amount": 500, "memo": ""}
    assert reply.approval.reason == "500 is over 100"
    assert reply.approval.expires_at == pytest.approx(time.time() + 900, abs=5)
    assert reply.approval.digest == approval_digest(
        "r-1", "call-1", "pay", {"amount": 500, "memo": ""}
    )
    assert "approval" in (reply.result.error or "")


async def test_a_call_under_the_limit_runs_without_approval() -> None:
    reply = await call(executor(), "pay", {"amount": 50})

    assert reply.outcome == "result"
    assert ran["pay"] == 1


async def test_an_approved_call_runs_once_and_the_tool_knows_who_approved() -> None:
    ex = executor()
    asked = await call(ex, "pay", {"amount": 500})
    assert asked.approval is not None
    grant = ApprovalGrant(decision="approved", digest=asked.approval.digest, approver="bob")

    reply = await call(ex, "pay", {"amount": 500}, approval=grant)
    again = await call(ex, "pay", {"amount": 500}, approval=grant)

    assert reply.outcome == "result"
    assert reply.result.result["amount"] == 500
    assert contexts[0].approved_by == "bob"
    assert again.replayed
    assert again.result == reply.result
    assert ran["pay"] == 1


async def test_an_approval_for_other_arguments_is_not_valid() -> None:
    ex = executor()
    asked = await call(ex, "pay", {"amount": 500})
    assert asked.approval is not None
    grant = ApprovalGrant(decision="approved", digest=asked.approval.digest, approver="bob")

    reply = await call(ex, "pay", {"amount": 9000}, approval=grant)

    assert reply.outcome == "approval_required"
    assert ran["pay"] == 0


async def test_an_approval_for_another_call_is_not_valid() -> None:
    ex = executor()
    asked = await call(ex, "pay", {"amount": 500}, call_id="call-1")
    assert asked.approval is not None
    grant = ApprovalGrant(decision="approved", digest=asked.approval.digest, approver="bob")

    reply = await call(ex, "pay", {"amount": 500}, call_id="call-2", approval=grant)

    assert reply.outcome == "approval_required"


@pytest.mark.parametrize(
    ("grant", "says"),
    [
        (ApprovalGrant(decision="denied", digest="x", approver="bob", note="too dear"), "bob"),
        (ApprovalGrant(decision="expired", digest="x"), "nobody decided in time"),
    ],
    ids=["denied", "expired"],
)
async def test_a_denied_or_expired_call_gives_the_model_a_result_saying_so(
    grant: ApprovalGrant, says: str
) -> None:
    reply = await call(executor(), "pay", {"amount": 500}, approval=grant)

    assert reply.outcome == "result"
    assert reply.result.error is not None
    assert reply.result.error.startswith("not run")
    assert says in reply.result.error
    assert ran["pay"] == 0


async def test_middleware_approval_and_the_tools_rule_are_asked_together() -> None:
    def four_eyes(call: Call) -> Decision:
        return RequireApproval(reason="payments need four eyes", expires_in=60)

    reply = await call(executor(four_eyes), "pay", {"amount": 500})

    assert reply.approval is not None
    assert reply.approval.reason == "payments need four eyes; 500 is over 100"
    assert reply.approval.expires_at == pytest.approx(time.time() + 60, abs=5)


async def test_a_refusal_later_in_the_chain_wins_over_an_earlier_approval() -> None:
    def four_eyes(call: Call) -> Decision:
        return RequireApproval(reason="payments need four eyes")

    reply = await call(executor(four_eyes, blocked_memo), "pay", {"amount": 5, "memo": "stop"})

    assert reply.outcome == "terminate"


async def test_a_redelivered_side_effecting_call_returns_the_recorded_result() -> None:
    store = MemoryCallStore()

    first = await call(executor(store=store), "pay", {"amount": 5})
    again = await call(executor(store=store), "pay", {"amount": 5})

    assert ran["pay"] == 1
    assert again.replayed
    assert again.result == first.result


class CountingStore(MemoryCallStore):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def get(self, key: str) -> tuple[CallRecord, int] | None:
        self.lookups += 1
        return await super().get(key)


async def test_a_first_send_is_claimed_without_a_lookup_and_a_repeat_is_looked_up() -> None:
    store = CountingStore()

    first = await call(executor(store=store), "pay", {"amount": 5}, first_send=True)
    assert store.lookups == 0
    again = await call(executor(store=store), "pay", {"amount": 5})

    assert store.lookups == 1
    assert ran["pay"] == 1
    assert again.replayed
    assert again.result == first.result


async def test_a_call_that_ran_already_is_not_run_again_even_sent_as_a_first_send() -> None:
    """The claim is a compare-and-set: a caller that wrongly thinks it never sent the call
    (two gateways on one run) gets the recorded result, not a second payment."""
    store = MemoryCallStore()

    first = await call(executor(store=store), "pay", {"amount": 5}, first_send=True)
    again = await call(executor(store=store), "pay", {"amount": 5}, first_send=True)

    assert ran["pay"] == 1
    assert again.replayed
    assert again.result == first.result


async def test_the_same_call_id_in_another_run_is_another_call() -> None:
    store = MemoryCallStore()
    other = RunContext(run_id="r-2", props=ALICE.props)

    await call(executor(store=store), "pay", {"amount": 5})
    await call(executor(store=store), "pay", {"amount": 5}, ctx=other)

    assert ran["pay"] == 2


async def test_side_effect_free_calls_are_not_recorded() -> None:
    store = MemoryCallStore()

    await call(executor(store=store), "lookup", {"term": "a"})
    await call(executor(store=store), "lookup", {"term": "a"})

    assert ran["lookup"] == 2
    assert store.records == {}


@pytest.mark.parametrize("first_send", [False, True])  # found by the lookup, or by the claim
async def test_a_call_found_started_by_an_executor_that_died_is_not_run_blindly(
    first_send: bool,
) -> None:
    store = MemoryCallStore()
    long_ago = time.time() - 3600
    await store.claim(
        call_key(Owner("acme", "alice"), "r-1", "call-1"),
        CallRecord(
            state="started", tool="pay", started_at=long_ago, lease_until=long_ago + 1, replica="x"
        ),
    )

    reply = await call(executor(store=store), "pay", {"amount": 5}, first_send=first_send)

    assert ran["pay"] == 0
    assert reply.result.error is not None
    assert reply.result.error.startswith("outcome unknown")
    assert "Check before trying again" in reply.result.error


@pytest.mark.parametrize("first_send", [False, True])
async def test_an_idempotent_tool_found_abandoned_runs_again_once(first_send: bool) -> None:
    store = MemoryCallStore()
    long_ago = time.time() - 3600
    await store.claim(
        call_key(Owner("acme", "alice"), "r-1", "call-1"),
        CallRecord(
            state="started",
            tool="upsert",
            started_at=long_ago,
            lease_until=long_ago + 1,
            replica="x",
        ),
    )

    first = await call(executor(store=store), "upsert", {"value": "v"}, first_send=first_send)
    again = await call(executor(store=store), "upsert", {"value": "v"}, first_send=first_send)

    assert first.result.result == "v"
    assert again.replayed
    assert ran["upsert"] == 1


async def test_a_duplicate_arriving_while_the_call_runs_waits_for_its_result() -> None:
    store = MemoryCallStore()

    one, two = await asyncio.gather(
        call(executor(store=store), "pay", {"amount": 5}),
        call(executor(store=store), "pay", {"amount": 5}),
    )

    assert ran["pay"] == 1
    assert {one.replayed, two.replayed} == {False, True}
    assert one.result == two.result


async def test_a_started_call_within_its_lease_is_waited_for_not_reported_unknown() -> None:
    store = MemoryCallStore()
    key = call_key(Owner("acme", "alice"), "r-1", "call-1")
    now = time.time()
    started = CallRecord(
        state="started", tool="pay", started_at=now, lease_until=now + 5, replica="other"
    )
    await store.claim(key, started)
    done = msgspec.structs.replace(
        started,
        state="done",
        result=FunctionResultContent(call_id="call-1", result={"paid": True}),
    )

    reads: list[str] = []
    get = store.get

    async def counting_get(key: str) -> tuple[CallRecord, int] | None:
        reads.append(key)
        return await get(key)

    store.get = counting_get  # type: ignore[method-assign]

    async def finish_elsewhere() -> None:
        await eventually(lambda: reads)  # the executor found the call started elsewhere
        await store.finish(key, done)

    finishing = asyncio.create_task(finish_elsewhere())
    reply = await call(executor(store=store), "pay", {"amount": 5})
    await finishing

    assert reply.replayed
    assert reply.result.result == {"paid": True}
    assert ran["pay"] == 0


async def test_a_side_effecting_call_outside_a_run_is_refused() -> None:
    reply = await call(executor(), "pay", {"amount": 5}, ctx=RunContext(props=ALICE.props))

    assert reply.result.error is not None
    assert ran["pay"] == 0


async def test_a_hung_async_tool_is_cut_at_its_timeout() -> None:
    started = time.monotonic()

    reply = await call(executor(), "hang", {})

    assert time.monotonic() - started < 2
    assert reply.result.error == "tool 'hang' timed out after 0.2s."


async def test_a_hung_sync_tool_is_cut_at_its_timeout_and_its_thread_abandoned() -> None:
    release.clear()
    try:
        with capture_logs() as logs:
            reply = await call(executor(), "hang_in_a_thread", {})
    finally:
        release.set()

    assert reply.result.error == "tool 'hang_in_a_thread' timed out after 0.2s."
    assert any(e["event"] == "tool_thread_abandoned" for e in logs)


async def test_the_runs_deadline_cuts_a_tool_before_its_own_timeout() -> None:
    soon = RunContext(run_id="r-1", props=ALICE.props, deadline=time.time() + 0.4)

    reply = await call(executor(), "slow", {"seconds": 3}, ctx=soon)

    assert reply.result.error is not None
    assert "timed out" in reply.result.error


async def test_a_run_past_its_deadline_runs_nothing() -> None:
    late = RunContext(run_id="r-1", props=ALICE.props, deadline=time.time() - 1)

    reply = await call(executor(), "lookup", {"term": "a"}, ctx=late)

    assert reply.result.error is not None
    assert ran["lookup"] == 0


async def test_cancelling_a_run_stops_its_calls_and_only_its_calls() -> None:
    ex = executor()
    other = RunContext(run_id="r-2", props=ALICE.props)
    mine = asyncio.create_task(call(ex, "slow", {"seconds": 3}))
    theirs = asyncio.create_task(call(ex, "slow", {"seconds": 0.3}, ctx=other))
    await eventually(lambda: ran["slow"] == 2)

    assert ex.cancel_run(Owner("globex", "mallory"), "r-1") == 0  # another owner's run of that id
    cancelled = ex.cancel_run(Owner.of(ALICE), "r-1")

    assert cancelled == 1
    assert (await mine).result.error == "not finished: the run was cancelled."
    assert (await theirs).result.result == "done"


async def test_a_side_effecting_call_runs_on_and_is_recorded_when_its_caller_leaves() -> None:
    store = MemoryCallStore()
    ex = executor(store=store)
    caller = asyncio.create_task(call(ex, "transfer", {"seconds": 0.2}))
    await eventually(lambda: ran["transfer"] == 1)

    caller.cancel()  # what the service does when the caller stops listening
    with pytest.raises(asyncio.CancelledError):
        await caller
    await ex.finish_started()
    record, _ = store.records[call_key(Owner("acme", "alice"), "r-1", "call-1")]
    repeated = await call(ex, "transfer", {"seconds": 0.2})

    assert ran["transferred"] == 1
    assert record.state == "done"
    assert record.result is not None
    assert record.result.result == "transferred"
    assert repeated.replayed
    assert repeated.result.result == "transferred"
    assert ran["transfer"] == 1


async def test_cancelling_the_run_still_cuts_a_side_effecting_call_short() -> None:
    store = MemoryCallStore()
    ex = executor(store=store)
    mine = asyncio.create_task(call(ex, "transfer", {"seconds": 3}))
    await eventually(lambda: ran["transfer"] == 1)

    assert ex.cancel_run(Owner.of(ALICE), "r-1") == 1
    reply = await mine
    record, _ = store.records[call_key(Owner("acme", "alice"), "r-1", "call-1")]

    assert reply.result.error == (
        "not finished: the run was cancelled. It may or may not have taken effect."
    )
    assert record.state == "done"
    assert ran["transferred"] == 0


async def test_a_tool_limited_to_some_agents_and_tenants_is_not_available_to_others() -> None:
    billing = RunContext(run_id="r-1", agent="billing", props={"tenant": "acme"})
    other_tenant = RunContext(run_id="r-1", agent="billing", props={"tenant": "globex"})

    assert (await call(executor(), "invoice", {}, ctx=billing)).result.result == "invoice"
    assert "no tool named" in ((await call(executor(), "invoice", {})).result.error or "")
    assert (await call(executor(), "invoice", {}, ctx=other_tenant)).result.error is not None


async def test_a_replayed_result_survives_a_store_round_trip_unchanged() -> None:
    store = MemoryCallStore()
    first = await call(executor(store=store), "pay", {"amount": 5})
    record, _ = store.records[call_key(Owner("acme", "alice"), "r-1", "call-1")]

    decoded = msgspec.json.decode(msgspec.json.encode(record), type=CallRecord)

    assert decoded.result == first.result
    assert decoded.state == "done"
    assert decoded.lease_until > decoded.started_at + LEASE_GRACE - 0.01


def test_call_keys_are_valid_kv_keys_whatever_the_ids_hold() -> None:
    key = call_key(Owner("acme", "alice"), "run with spaces/..", "call.id with * and >")

    assert all(c.isalnum() or c in "-_." for c in key)
    assert key.count(".") == 3
    alice = Owner("acme", "alice")
    assert call_key(alice, "r-1", "a") != call_key(alice, "r-1", "b")
    assert call_key(alice, "r-1", "a").startswith("acme.alice.r-1.")


def test_call_keys_stay_those_of_the_records_already_stored() -> None:
    call_digest = hashlib.sha256(b"call-1").hexdigest()[:32]
    run_digest = hashlib.sha256(b"run 1").hexdigest()[:32]

    assert call_key(Owner("acme", "alice"), "r-1", "call-1") == f"acme.alice.r-1.{call_digest}"
    assert call_key(Owner("acme", "alice"), "run 1", "call-1") == (
        f"acme.alice.h-{run_digest}.{call_digest}"
    )


async def test_another_owners_run_of_the_same_id_never_gets_a_call_record_replayed() -> None:
    store = MemoryCallStore()
    carol = RunContext(run_id="r-1", agent="travel", props={"user_id": "carol", "tenant": "globex"})

    mine = await call(executor(store=store), "pay", {"amount": 5})
    theirs = await call(executor(store=store), "pay", {"amount": 7}, ctx=carol)

    assert ran["pay"] == 2
    assert not theirs.replayed
    assert theirs.result != mine.result
    assert call_key(Owner.of(ALICE), "r-1", "c") != call_key(Owner.of(carol), "r-1", "c")
