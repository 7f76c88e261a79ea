"""Whether each model server the routes call answers, so one that is down is named — in the log
and in `runbus status`, as the reason the router is *degraded* — before a run fails on it.

Each distinct server (`base_url`) is checked once at start, in the background, then again
with backoff while it is down (0.5 s doubling to 15 s). While it is up, a call that gets an
answer is proof enough: it is probed only after `UP_INTERVAL` without one. A call that cannot
connect marks it down at once; a call that times out or breaks off only brings its next probe
forward, since a slow model or a long prompt is not a dead server.

The probe is `GET {base_url}/models` with a short timeout, through the backend's own client
(its headers and credential, as every call sends them; never logged). An HTTP request rather
than a TCP connect because it sees what a connect cannot: a proxy or gateway whose model
server is gone (502, 503, 504), llama.cpp still loading its model (503), TLS that fails. Any
other answer, 401 and 404 included, means the server is there.
"""

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from runbus.progress import BACKOFF
from runbus.runner import redact_url

from .http_session import Proxy

UP_INTERVAL: Final = 60.0
"""Seconds a server that is up goes without a probe (a call that gets an answer restarts it)."""
PROBE_TIMEOUT: Final = 3.0
"""Seconds a probe waits for the server's answer."""
GATEWAY_DOWN: Final = frozenset({502, 503, 504})
"""Statuses that say the model server behind the URL is not there (or not ready) yet."""


class Reporter(Protocol):
    """Where a server going down or coming back is said (`runbus.progress.Progress`)."""

    def dependency_down(self, dependency: str, reason: str) -> None: ...

    def dependency_up(self, dependency: str) -> None: ...


def shown_url(url: str) -> str:
    """`url` without a password, token or query string: what a log line or report may carry."""
    parts = urlsplit(redact_url(url))
    return urlunsplit(parts._replace(query="", fragment=""))


def problem_of(exc: BaseException) -> str:
    """What a failed connection says, in a few words (`connection refused`): the OS error at
    the bottom of the exception chain, else the exception's own text."""
    found: OSError | None = None
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            found = seen
        seen = seen.__cause__ or seen.__context__
    if found is not None and found.errno is not None and found.errno > 0:
        return os.strerror(found.errno).lower()
    if found is not None and found.strerror:
        return found.strerror.lower()
    return str(exc) or type(exc).__name__


@dataclass(frozen=True)
class ModelServer:
    """One server as the routes file names it: its URL and who calls it."""

    url: str
    """Base URL as it may be shown (no credentials)."""
    backends: tuple[str, ...]
    """`[backends.<name>]` entries with this URL."""
    routes: tuple[str, ...]
    """Routes with a target on one of those backends."""

    def describe(self) -> str:
        """`model server http://h:8081/v1 (route "local", backend "lb" in RUNBUS_MODEL_ROUTES)`."""
        routes = ", ".join(f'"{name}"' for name in self.routes)
        backends = ", ".join(f'"{name}"' for name in self.backends)
        return (
            f"model server {self.url} (route{'s' if len(self.routes) > 1 else ''} {routes}, "
            f"backend{'s' if len(self.backends) > 1 else ''} {backends} in RUNBUS_MODEL_ROUTES)"
        )


class ServerHealth:
    """One server's health and when to look at it next, from probes and from real calls. No
    I/O: `ServerWatch` probes it when `due`, calls report through the same methods."""

    def __init__(
        self,
        server: ModelServer,
        reporter: Reporter,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff: tuple[float, ...] = BACKOFF,
        up_interval: float = UP_INTERVAL,
    ) -> None:
        self.server = server
        self.up: bool | None = None
        """None until the first probe or call says."""
        self.failures = 0
        """Failed checks in a row: the backoff step."""
        self.due = clock()
        """When the next probe is due (`clock` time): at once, for the check at start."""
        self._reporter = reporter
        self._clock = clock
        self._backoff = backoff
        self._up_interval = up_interval
        self.wake: Callable[[], None] = lambda: None
        """Called when `due` moved earlier, so the prober does not sleep past it."""

    def answered(self) -> None:
        """The server answered (a probe, or a call that got a response)."""
        self.failures = 0
        self.due = self._clock() + self._up_interval
        if self.up is not True:
            self.up = True
            self._reporter.dependency_up(self.server.url)

    def failed(self, problem: str) -> None:
        """A probe found it down: `problem` says how (`connection refused`, `answers HTTP
        503`). Checked again after the next backoff step."""
        self.failures += 1
        self._down(problem)

    def unreachable(self, problem: str) -> None:
        """A call could not connect. Down at once; while it already is, the probes keep
        their pace (failing calls do not push the next probe back)."""
        if self.up is False:
            return
        self.failures = 1
        self._down(problem)

    def doubt(self) -> None:
        """A call failed in a way a live server can fail too (a timeout, a broken stream, a
        gateway error): look now rather than at the next scheduled probe."""
        now = self._clock()
        if self.due > now:
            self.due = now
            self.wake()

    def reason(self, problem: str) -> str:
        return f"{self.server.describe()} is unreachable: {problem}"

    def _down(self, problem: str) -> None:
        self.up = False
        self.due = self._clock() + self._backoff[min(self.failures, len(self._backoff)) - 1]
        self._reporter.dependency_down(self.server.url, self.reason(problem))
        self.wake()


Probe = Callable[[], Awaitable[str | None]]
"""Checks one server: None when it answers, else the problem in a few words."""


class Endpoint(Protocol):
    """A backend's HTTP side, as the probe uses it (`openai_chat.OpenAIEndpoint`)."""

    @property
    def models_url(self) -> URL: ...

    @property
    def headers(self) -> CIMultiDict[str]: ...

    @property
    def proxy(self) -> Proxy: ...

    @property
    def proxy_headers(self) -> dict[str, str] | None: ...

    def session(self) -> aiohttp.ClientSession: ...


def http_probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> Probe:
    """`GET {base_url}/models` through the backend's own session."""

    async def probe() -> str | None:
        try:
            async with endpoint.session().get(
                endpoint.models_url,
                headers=endpoint.headers,
                proxy=endpoint.proxy.url,
                proxy_headers=endpoint.proxy_headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,
            ) as response:
                status = response.status
        except TimeoutError:  # aiohttp's timeouts are TimeoutErrors too
            return f"no answer within {timeout:g}s"
        except aiohttp.ClientError as exc:
            return problem_of(exc)
        if status in GATEWAY_DOWN:
            return f"answers HTTP {status}"
        return None

    return probe


class ServerWatch:
    """Probes every server whose check is due, from one background task."""

    def __init__(self, servers: Iterable[tuple[ServerHealth, Probe]]) -> None:
        self.servers = list(servers)
        self._wake = asyncio.Event()
        for health, _ in self.servers:
            health.wake = self._wake.set
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.servers and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = time.monotonic()
            due = [(health, probe) for health, probe in self.servers if health.due <= now]
            if due:
                await asyncio.gather(*(self._check(health, probe) for health, probe in due))
                continue
            wait = min(health.due for health, _ in self.servers) - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    @staticmethod
    async def _check(health: ServerHealth, probe: Probe) -> None:
        try:
            problem = await probe()
        except Exception as exc:  # whatever breaks a probe says the server is not usable
            problem = problem_of(exc)
        if problem is None:
            health.answered()
        else:
            health.failed(problem)
