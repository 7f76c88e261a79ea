"""A run this replica holds, from admission to ack: one object owns its run slot (lent out
while it queues for its tenant), its tenant lease, its cancel, its waiting state and their
cleanup. The service holds them in a `runbus.cancels.RunCancels` by owner and run id, so a
cancel never reaches another owner's run."""

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Final, Literal

import structlog

from runbus.headers import RunContext
from runbus.messages import RunCompleted, RunRequest
from runbus.messages.runs import RunRecord, RunStatus
from runbus.owners import Owner

from .agents import AgentSpec
from .errors import RunCancelled
from .pauses import Pauses
from .ports import BusPorts
from .run import RunPorts, execute_run
from .run.pause import PausePoint
from .runs import RunRecords
from .tenants import TenantSlots

TENANT_POLL: Final = 0.2
"""Seconds between a queued run's tries for a slot of its tenant."""

log = structlog.get_logger()


@dataclass(frozen=True)
class Slots:
    """This replica's run slots, and the places a run parks in instead while it waits (queued
    for its tenant, or for a person's decision)."""

    running: asyncio.Semaphore
    parked: asyncio.Semaphore
    returning: set[asyncio.Task[Literal[True]]] = field(default_factory=set)
    """Slots being taken back for runs that ended while they waited for one."""

    async def lend(self) -> bool:
        """Give out the run slot the calling run holds and take a parked place instead, if
        one is free; whether it did."""
        if self.parked.locked():
            return False
        await self.parked.acquire()  # free: returns at once
        self.running.release()
        return True

    async def take_back(self) -> None:
        """Hold a run slot again in place of the parked one that `lend` took.

        A run that goes on waits for a slot (the replica may be full). A run that is ending
        (cancelled, or cut off by a draining replica, which holds every slot) does not wait:
        its slot is taken back in the background once one frees, so the consumer's release of
        it when the run ends never counts one too many.
        """
        taking = asyncio.ensure_future(self.running.acquire())
        self.returning.add(taking)
        taking.add_done_callback(self.returning.discard)
        try:
            current = asyncio.current_task()
            if current is None or not current.cancelling():
                await asyncio.shield(taking)
        finally:
            self.parked.release()


class LocalRun:
    def __init__(
        self,
        request: RunRequest,
        agent: AgentSpec,
        ctx: RunContext,
        record: RunRecord,
        *,
        records: RunRecords,
        tenants: TenantSlots | None,
        slots: Slots,
        renew_every: float,
    ) -> None:
        self.request = request
        self.agent = agent
        self.ctx = ctx
        self.record = record
        self._records = records
        self._tenants = tenants
        self._slots = slots
        self._renew_every = renew_every
        self._lease: asyncio.Task[None] | None = None
        self._task: asyncio.Task[RunCompleted] | None = None
        self._queued = False
        self._cancelled = False
        self._waiting = 0
        """Calls waiting now (for people or child runs): the slot and lease are lent meanwhile."""
        self._people = 0
        """Calls waiting for a person now: the run shows `waiting_approval` meanwhile."""
        self._lent = False
        """Whether the run lent its run slot out while it waits for a person."""
        self._lease_given = False
        """Whether the run gave its tenant lease back while it waits."""

    @property
    def run_id(self) -> str:
        return self.request.run_id

    @property
    def owner(self) -> Owner:
        return Owner(self.record.tenant, self.record.user_id)

    @property
    def lease_key(self) -> str:
        """Its entry in its tenant's leases: the user too, so no other user's run shares it."""
        return self.owner.user_key(self.run_id)

    def cancelled(self) -> bool:
        """Its owner cancelled it (a method: the answer changes while the run awaits)."""
        return self._cancelled

    async def set_status(self, status: RunStatus) -> None:
        self.record = await self._records.set_status(self.record, status)

    # -- the tenant's slot ---------------------------------------------------------------

    async def take_tenant_slot(self) -> None:
        """Wait, as `queued`, until the run's tenant is under its concurrent-run limit.

        A waiting run lends its run slot out, so one tenant's backlog does not stop this
        replica from running other tenants' runs; the consumer's heartbeat keeps it from
        redelivery meanwhile.
        """
        tenants = self._tenants
        if tenants is None:
            return
        tenant = self.record.tenant
        if not await tenants.try_acquire(tenant, self.lease_key):
            log.info("run_queued", run_id=self.run_id, tenant=tenant)
            await self.set_status("queued")
            parked = await self._slots.lend()
            self._queued = True
            try:
                # Polled rather than watched: a slot frees when any replica's run ends, and
                # a watch per queued run would cost more than a read every TENANT_POLL s.
                while True:
                    if self.cancelled():
                        raise RunCancelled(self.run_id)
                    if await tenants.try_acquire(tenant, self.lease_key):
                        break
                    await asyncio.sleep(TENANT_POLL)
            finally:
                self._queued = False
                if parked:
                    await self._slots.take_back()
        self._lease = asyncio.create_task(self._renew(tenants))

    async def _renew(self, tenants: TenantSlots) -> None:
        while True:
            await asyncio.sleep(self._renew_every)
            with contextlib.suppress(Exception):
                await tenants.renew(self.record.tenant, self.lease_key)

    async def release(self) -> None:
        """Give back what the run holds here; safe on every path, and more than once."""
        if self._lease is None:
            return
        self._lease.cancel()
        self._lease = None
        if self._tenants is not None:
            with contextlib.suppress(Exception):
                await self._tenants.release(self.record.tenant, self.lease_key)

    # -- running -------------------------------------------------------------------------

    async def execute(self, ports: RunPorts) -> RunCompleted:
        """Run it (or resume it); a cancel of its owner ends it with `RunCancelled`."""
        if self.cancelled():
            raise RunCancelled(self.run_id)
        pause = (
            PausePoint(
                Pauses(ports.approvals.bucket.kv),
                self.owner,
                self.on_paused,
                attempt=self.record.attempts,
            )
            if isinstance(ports, BusPorts)
            else None
        )
        task = asyncio.ensure_future(
            execute_run(self.request, self.agent, self.ctx, ports, self.on_waiting, pause)
        )
        self._task = task
        try:
            return await task
        except asyncio.CancelledError:
            # Cancelled by its owner, not because this delivery itself is being cut off.
            if not self.cancelled() or not task.cancelled():
                raise
            raise RunCancelled(self.run_id) from None

    def cancel(self) -> None:
        self._cancelled = True
        if self._queued:
            log.info("run_cancelling", run_id=self.run_id, status="queued")
        elif self._task is not None and not self._task.done():
            self._task.cancel()
            log.info("run_cancelling", run_id=self.run_id)

    async def on_waiting(self, waiting: bool, *, person: bool = True) -> None:
        """`waiting_approval` while any call of the run waits for a person, else `running`
        (a wait for a child run, `person=False`, lends the slot without the status).

        Meanwhile the run lends its run slot out, as a queued run does: runs waiting for
        people, who may take hours, do not stop this replica from running others (up to
        `PARKED_PER_SLOT` per slot; past that a waiting run keeps its slot).
        """
        step = 1 if waiting else -1
        self._waiting += step
        if self._waiting == (1 if waiting else 0):  # the first wait, or the last one over
            if waiting:
                await self._lend_slot()
                await self._give_lease_back()
            else:
                await self._retake_lease()
                await self._take_slot_back()
        if not person:
            return
        self._people += step
        if self._people != (1 if waiting else 0):
            return  # the status only changes on the first wait and the last decision
        if self.cancelled():
            return  # its final status (`cancelled`) is the bookkeeping's to write
        with contextlib.suppress(Exception):
            await self.set_status("waiting_approval" if waiting else "running")

    async def on_paused(self, paused: bool) -> None:
        """`paused` while its owner holds it at a step boundary, else `running`; its run slot
        is lent out meanwhile, as while it waits for a person's decision."""
        if paused:
            await self._lend_slot()
            await self._give_lease_back()
        else:
            await self._retake_lease()
            await self._take_slot_back()
        if self.cancelled():
            return
        with contextlib.suppress(Exception):
            await self.set_status("paused" if paused else "running")

    async def _give_lease_back(self) -> None:
        """A run waiting (for a person, or for a child run of the same tenant, which needs a
        lease to run at all) does not count against its tenant's limit meanwhile."""
        if self._lease is None or self._tenants is None:
            return
        self._lease.cancel()
        self._lease = None
        self._lease_given = True
        with contextlib.suppress(Exception):
            await self._tenants.release(self.record.tenant, self.lease_key)

    async def _retake_lease(self) -> None:
        """Take the tenant lease again once the wait is over, with the run slot still lent
        out (a slot held while waiting for the tenant could be the one its others need)."""
        tenants = self._tenants
        if not self._lease_given or tenants is None:
            return
        self._lease_given = False
        while True:  # polled, as a queued run's first lease is (`take_tenant_slot`)
            if await tenants.try_acquire(self.record.tenant, self.lease_key):
                break
            await asyncio.sleep(TENANT_POLL)
        self._lease = asyncio.create_task(self._renew(tenants))

    async def _lend_slot(self) -> None:
        if not self._lent:
            self._lent = await self._slots.lend()

    async def _take_slot_back(self) -> None:
        if self._lent:
            self._lent = False
            await self._slots.take_back()
