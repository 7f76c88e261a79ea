"""The work a process has in flight for each run, by owner and run id, so that a cancel of one
owner's run (`subjects.run_cancel`) stops exactly that work and never another owner's."""

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from . import subjects
from .owners import Owner


def parse_cancel(subject: str) -> tuple[Owner, str] | None:
    """The owner and run id a `subjects.run_cancel` subject names, or None for another one."""
    named = subjects.parse_run_cancel(subject)
    if named is None:
        return None
    tenant, user_id, run_id = named
    return Owner(tenant, user_id), run_id


class Cancellable(Protocol):
    """Anything a cancel can stop: an `asyncio.Task`, a gateway's run."""

    def cancel(self) -> object: ...


W = TypeVar("W", bound=Cancellable)


class RunCancels(Generic[W]):
    """In-flight work by (owner, run id); a cancel reaches only the work of that pair.

    With `remember`, the last that many cancelled runs are kept, so work that arrives after
    its run's cancel can be refused (`cancelled`).
    """

    def __init__(self, *, remember: int = 0) -> None:
        self._held: dict[tuple[Owner, str], list[W]] = {}
        self._remember = remember
        self._cancelled: OrderedDict[tuple[Owner, str], None] = OrderedDict()

    @contextlib.contextmanager
    def holding(self, owner: Owner, run_id: str, work: W) -> Iterator[W]:
        """Hold `work` for the owner's run while the block runs (work of no run, `run_id`
        "", is not held: no cancel names it)."""
        if not run_id:
            yield work
            return
        run = (owner, run_id)
        held = self._held.setdefault(run, [])
        held.append(work)
        try:
            yield work
        finally:
            held.remove(work)
            if not held and self._held.get(run) is held:
                del self._held[run]

    def held(self, owner: Owner, run_id: str) -> list[W]:
        """The work held for the owner's run now."""
        return list(self._held.get((owner, run_id), ()))

    def cancel(self, owner: Owner, run_id: str) -> int:
        """Cancel every piece of work held for the owner's run; how many there were."""
        run = (owner, run_id)
        if self._remember:
            self._cancelled[run] = None
            self._cancelled.move_to_end(run)
            while len(self._cancelled) > self._remember:
                self._cancelled.popitem(last=False)
        held = self.held(owner, run_id)
        for work in held:
            work.cancel()
        return len(held)

    def cancel_subject(self, subject: str) -> int:
        """`cancel` the run a `subjects.run_cancel` subject names (0 for any other subject)."""
        named = parse_cancel(subject)
        return 0 if named is None else self.cancel(*named)

    def cancelled(self, owner: Owner, run_id: str) -> bool:
        """The owner's run is among the last `remember` cancelled ones."""
        return (owner, run_id) in self._cancelled
