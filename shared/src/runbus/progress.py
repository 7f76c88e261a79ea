"""A service process's start-up progress: the step it is on, logged and published on
`runbus.progress.<service>` so `runbus up` and `runbus status` can tell slow from stuck, and
the retry-with-backoff of a dependency that is down, which names it while it waits. Once
ready, a process that still serves with a dependency down (a model server of one route) is
*degraded*: named the same way, reported until the dependency is back."""

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import structlog
from nats.aio.client import Client as NATS

from . import subjects
from .messages import encode
from .messages.progress import ProgressState, ServiceProgress

T = TypeVar("T")

HEARTBEAT: Final = 1.0
"""Seconds between reports while not ready (or degraded): silence longer than a stall window
means the process (or its event loop) is stuck, not slow."""
BACKOFF: Final = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""Seconds between tries of a dependency that is down; the last one repeats."""

log = structlog.get_logger()


class Progress:
    """What one process is doing while it starts, and which dependencies are down once it
    runs. Logs each step and each dependency going down or coming back once; once `attach`ed
    to a connection, also publishes it (at every change, and every `HEARTBEAT` while not
    ready or degraded)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.state: ProgressState = "starting"
        self.step = "starting"
        self.reason = ""
        self.attempt = 0
        self._began = time.monotonic()
        self._down: dict[str, str] = {}
        """Dependencies that are down while the process serves: name → reason."""
        self._nc: NATS | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    def attach(self, nc: NATS) -> None:
        """Publish from now on over `nc`."""
        self._nc = nc
        self._publish()
        self._keep_beating()

    def report(self, step: str) -> None:
        """A new step (`opening the memory store`)."""
        self._move("starting", step, "", 0)
        log.info("startup_step", service=self.service, step=step)

    def waiting(self, step: str, reason: str, attempt: int) -> None:
        """`step` cannot go on: `reason` names what is down; it is tried again."""
        self._move("waiting", step, reason, attempt)
        log.warning("dependency_down", service=self.service, reason=reason, attempt=attempt)

    def ready(self) -> None:
        """Serving; degraded at once if a dependency went down meanwhile."""
        self._move(*self._serving())

    def stopping(self) -> None:
        self._move("stopping", "stopping", "", 0)

    def dependency_down(self, dependency: str, reason: str) -> None:
        """`dependency` (e.g. a model server's URL) does not answer while this process serves
        without it: it is degraded until `dependency_up`. `reason` names the URL and the
        setting; it is logged when the dependency goes down (not again while it stays down)
        and published with every report."""
        if dependency not in self._down:
            log.warning(
                "dependency_down", service=self.service, dependency=dependency, reason=reason
            )
        self._down[dependency] = reason
        self._settle()

    def dependency_up(self, dependency: str) -> None:
        """`dependency` answers again (a no-op when it was not down)."""
        reason = self._down.pop(dependency, None)
        if reason is None:
            return
        log.info("dependency_up", service=self.service, dependency=dependency, was=reason)
        self._settle()

    @property
    def down(self) -> dict[str, str]:
        """Dependencies down right now, with their reasons."""
        return dict(self._down)

    def snapshot(self) -> ServiceProgress:
        return ServiceProgress(
            service=self.service,
            instance=self.instance,
            state=self.state,
            step=self.step,
            reason=self.reason,
            attempt=self.attempt,
            elapsed=round(time.monotonic() - self._began, 3),
        )

    def _settle(self) -> None:
        """Once serving: degraded while a dependency is down, else ready. Before (starting,
        waiting) the start's own state stands; `ready` settles it."""
        if self.state not in ("ready", "degraded"):
            return
        serving = self._serving()
        if serving != (self.state, self.step, self.reason, self.attempt):
            self._move(*serving)

    def _serving(self) -> tuple[ProgressState, str, str, int]:
        if self._down:
            return "degraded", "ready", "; ".join(self._down[d] for d in sorted(self._down)), 0
        return "ready", "ready", "", 0

    def _move(self, state: ProgressState, step: str, reason: str, attempt: int) -> None:
        self.state, self.step, self.reason, self.attempt = state, step, reason, attempt
        self._publish()
        self._keep_beating()

    def _publish(self) -> None:
        if self._nc is None or not self._nc.is_connected:
            return
        data = encode(self.snapshot())
        # Fire and forget: a report lost while NATS reconnects is followed by the next one.
        task = asyncio.get_running_loop().create_task(
            self._nc.publish(subjects.progress(self.service), data)
        )
        task.add_done_callback(_ignore_failure)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            self._publish()

    def _keep_beating(self) -> None:
        """Beat while there is something to say (not ready yet, or degraded); a ready or
        stopping process is silent."""
        if self.state in ("ready", "stopping"):
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                self._heartbeat = None
        elif self._nc is not None and self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())


def _ignore_failure(task: "asyncio.Task[None]") -> None:
    if not task.cancelled():
        task.exception()


_current = Progress("")


def install(progress: Progress) -> None:
    """Make `progress` the one `report` and `retrying` speak through (the runner does this)."""
    global _current
    _current = progress


def current() -> Progress:
    return _current


def report(step: str) -> None:
    """Say which start-up step this process is on (a no-op report where nobody listens)."""
    _current.report(step)


async def retrying(
    step: str,
    call: Callable[[], Awaitable[T]],
    *,
    down: Callable[[Exception], str | None],
    backoff: tuple[float, ...] = BACKOFF,
) -> T:
    """`call()` until it succeeds. A failure `down` explains (it returns the reason, naming the
    URL and the setting) is reported as waiting and retried with backoff; any other is raised.
    """
    report(step)
    attempt = 0
    while True:
        try:
            result = await call()
        except Exception as exc:
            reason = down(exc)
            if reason is None:
                raise
            attempt += 1
            _current.waiting(step, reason, attempt)
            await asyncio.sleep(backoff[min(attempt, len(backoff)) - 1])
            continue
        if attempt:
            _current.report(step)
        return result
