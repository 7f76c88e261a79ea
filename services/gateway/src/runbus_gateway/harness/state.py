"""The session's state bag during one run: read from the record the run opened, changed with
compare-and-set on the session's revision.

Calls in one run go one at a time (a lock), so parallel tool calls of one model reply cannot
take the same todo id; writers elsewhere (another replica, a host's `/mode`) make the write
fail with `conflict`, and the change is applied again to what they wrote. No update is lost.
A record read again that is of another incarnation (the session was deleted and made again
under the same id) is not adopted: the run stops with `not_found` rather than write its
state into someone's new session.
"""

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, TypeVar

from runbus.errors import RemoteError
from runbus.headers import RunContext
from runbus.messages.sessions import SessionRecord

from .errors import SessionGone, StateConflict

T = TypeVar("T")

MAX_ATTEMPTS: Final = 8


class StatePort(Protocol):
    """What the state bag needs from the bus (the gateway's `BusPorts` implements it)."""

    async def get_session(self, ctx: RunContext) -> SessionRecord:
        """The run's session record as stored now (`runbus.sessions.get`)."""
        ...

    async def update_state(
        self, ctx: RunContext, key: str, value: Any, expected_revision: int
    ) -> SessionRecord:
        """Set `key` (None removes it) if the record is still at `expected_revision`
        (`runbus.sessions.state.update`); returns the updated record. Raises `RemoteError`
        with code `conflict` when another writer changed the record first."""
        ...


class SessionState:
    def __init__(self, port: StatePort, ctx: RunContext, record: SessionRecord) -> None:
        self._port = port
        self._ctx = ctx
        self._bag: dict[str, Any] = dict(record.state)
        self._revision = record.revision
        self._incarnation = record.incarnation
        self._lock = asyncio.Lock()

    @property
    def bag(self) -> Mapping[str, Any]:
        """The state bag as this run last read or wrote it."""
        return self._bag

    @property
    def revision(self) -> int:
        return self._revision

    async def change(self, key: str, change: Callable[[Any], tuple[Any, T]]) -> T:
        """Apply `change` to the value under `key` and store what it returns.

        `change(current) -> (new, outcome)` must be pure: after a conflict it runs again on
        the value another writer stored. When `new == current` nothing is written. Returns
        the outcome of the run that was stored; raises `StateConflict` when other writers
        won `MAX_ATTEMPTS` times in a row.
        """
        async with self._lock:
            for attempt in range(MAX_ATTEMPTS):
                current = self._bag.get(key)
                new, outcome = change(current)
                if new == current:
                    return outcome
                try:
                    record = await self._port.update_state(self._ctx, key, new, self._revision)
                except RemoteError as exc:
                    if exc.known_code != "conflict":
                        raise
                    record = await self._port.get_session(self._ctx)
                    self._adopt(record)
                    await asyncio.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))
                    continue
                self._adopt(record)
                return outcome
            raise StateConflict(key, MAX_ATTEMPTS)

    async def refresh(self) -> None:
        """Read the bag again (e.g. before the loop evaluator looks at it)."""
        async with self._lock:
            self._adopt(await self._port.get_session(self._ctx))

    def _adopt(self, record: SessionRecord) -> None:
        if record.incarnation != self._incarnation:
            raise SessionGone(record.session_id)
        self._bag = dict(record.state)
        self._revision = record.revision
