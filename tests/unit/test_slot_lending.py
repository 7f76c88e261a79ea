"""A run waiting for a person lends its run slot out and takes it back after the decision,
without ever leaving the replica with one slot too many or too few."""

import asyncio
from typing import Any, cast

import pytest

from runbus_gateway.local_run import LocalRun, Slots
from tests.helpers import eventually


def waiting_run(slots: Slots) -> LocalRun:
    """A run as the consumer hands it over: holding one run slot. Its record writes are not
    what these tests look at (`on_waiting` never fails on them)."""
    nothing = cast(Any, None)
    return LocalRun(
        nothing, nothing, nothing, nothing,
        records=nothing, tenants=None, slots=slots, renew_every=1.0,
    )  # fmt: skip


async def free(semaphore: asyncio.Semaphore) -> int:
    """How many times it can be taken now without waiting (given back afterwards)."""
    taken = 0
    while not semaphore.locked():
        await semaphore.acquire()  # returns at once: it is not locked
        taken += 1
    for _ in range(taken):
        semaphore.release()
    return taken


async def test_a_run_waiting_for_a_person_frees_its_slot_until_the_decision() -> None:
    slots = Slots(running=asyncio.Semaphore(1), parked=asyncio.Semaphore(4))
    await slots.running.acquire()  # the consumer's, for this run
    run = waiting_run(slots)

    await run.on_waiting(True)
    assert (await free(slots.running), await free(slots.parked)) == (1, 3)
    await run.on_waiting(False)

    assert (await free(slots.running), await free(slots.parked)) == (0, 4)


async def test_a_run_waiting_on_two_calls_lends_its_slot_once() -> None:
    slots = Slots(running=asyncio.Semaphore(1), parked=asyncio.Semaphore(4))
    await slots.running.acquire()
    run = waiting_run(slots)

    await run.on_waiting(True)
    await run.on_waiting(True)
    assert (await free(slots.running), await free(slots.parked)) == (1, 3)
    await run.on_waiting(False)
    assert (await free(slots.running), await free(slots.parked)) == (1, 3)
    await run.on_waiting(False)

    assert (await free(slots.running), await free(slots.parked)) == (0, 4)


async def test_with_no_parking_place_left_a_waiting_run_keeps_its_slot() -> None:
    slots = Slots(running=asyncio.Semaphore(1), parked=asyncio.Semaphore(0))
    await slots.running.acquire()
    run = waiting_run(slots)

    await run.on_waiting(True)
    assert await free(slots.running) == 0
    await run.on_waiting(False)

    assert await free(slots.running) == 0


async def test_a_run_cut_off_while_it_waits_for_its_slot_back_leaves_the_count_right() -> None:
    slots = Slots(running=asyncio.Semaphore(1), parked=asyncio.Semaphore(4))
    await slots.running.acquire()
    run = waiting_run(slots)
    await run.on_waiting(True)
    await slots.running.acquire()  # another run took the lent slot

    decided = asyncio.ensure_future(run.on_waiting(False))
    await eventually(lambda: slots.returning, what="the run waiting for its slot back")
    decided.cancel()  # the run is cut off meanwhile
    with pytest.raises(asyncio.CancelledError):
        await decided
    assert await free(slots.parked) == 4
    slots.running.release()  # the other run ends: the slot goes to the one cut off ...
    await asyncio.gather(*slots.returning)
    slots.running.release()  # ... whose end the consumer then counts, as for any run

    assert await free(slots.running) == 1
    assert not slots.returning


async def test_a_waiting_run_cut_off_by_a_draining_replica_ends_without_waiting_for_a_slot() -> (
    None
):
    slots = Slots(running=asyncio.Semaphore(1), parked=asyncio.Semaphore(4))
    await slots.running.acquire()
    run = waiting_run(slots)
    lent = asyncio.Event()

    async def wait_for_a_person() -> None:
        await run.on_waiting(True)
        lent.set()
        try:
            await asyncio.Event().wait()  # nobody decides
        finally:
            await run.on_waiting(False)

    waiting = asyncio.ensure_future(wait_for_a_person())
    await lent.wait()
    await slots.running.acquire()  # the draining replica holds every slot
    waiting.cancel()  # and cuts the run off
    ended, _ = await asyncio.wait({waiting}, timeout=5)  # returns as soon as it ends
    assert ended == {waiting}, "the run waited for a slot the draining replica holds"
    assert waiting.cancelled()
    slots.running.release()  # (were the replica to go on:) a slot frees ...
    await asyncio.gather(*slots.returning)  # ... and goes to the run that was cut off
    slots.running.release()  # whose end the consumer counts

    assert await free(slots.parked) == 4
    assert await free(slots.running) == 1
