"""An approval answers the arguments it was asked for, never other arguments of the same call."""

import asyncio
import time

from nats.aio.client import Client as NATS

from runbus.messages.tools import ApprovalRequest
from runbus.owners import Owner
from runbus_gateway.approvals import Approvals, approval_key
from tests.helpers import eventually


def _request(cabin: str) -> ApprovalRequest:
    return ApprovalRequest(
        tool="book_flight",
        arguments={"cabin": cabin},
        reason="books a seat",
        expires_at=time.time() + 60,
        digest=f"digest-of-{cabin}",
    )


async def test_a_call_asked_again_with_other_arguments_waits_for_a_new_decision(
    nc: NATS,
) -> None:
    approvals = await Approvals.open(nc)
    key = approval_key(Owner("acme", "alice"), "run-1", "call-1")

    first = asyncio.create_task(
        approvals.wait("run-1", "call-1", "acme", "alice", _request("economy"))
    )
    await eventually(lambda: approvals.bucket.get(key), what="the first request recorded")
    await approvals.decide("run-1", "call-1", "acme", "alice", "approved", "")
    granted = await first
    assert (granted.decision, granted.digest) == ("approved", "digest-of-economy")

    # The same call, its arguments edited: the yes to economy must not answer first class.
    second = asyncio.create_task(
        approvals.wait("run-1", "call-1", "acme", "alice", _request("first"))
    )

    async def asked_again() -> bool:
        found = await approvals.bucket.get(key)
        assert found is not None
        return found[0].request.digest == "digest-of-first" and found[0].status == "pending"

    await eventually(asked_again, what="the edited call asked again")
    assert not second.done()
    await approvals.decide("run-1", "call-1", "acme", "alice", "denied", "not first class")
    answered = await second
    assert (answered.decision, answered.digest) == ("denied", "digest-of-first")


async def test_the_same_request_asked_again_keeps_its_decision(nc: NATS) -> None:
    approvals = await Approvals.open(nc)
    key = approval_key(Owner("acme", "alice"), "run-2", "call-1")
    request = _request("economy")

    first = asyncio.create_task(approvals.wait("run-2", "call-1", "acme", "alice", request))
    await eventually(lambda: approvals.bucket.get(key), what="the request recorded")
    await approvals.decide("run-2", "call-1", "acme", "alice", "approved", "")
    await first
    # A redelivery of the run asks for the very same arguments: the decision stands.
    again = await approvals.wait("run-2", "call-1", "acme", "alice", request)
    assert (again.decision, again.digest) == ("approved", "digest-of-economy")
