"""MCP servers a deployment names: their configuration, and one supervised session per server
and replica (a stdio child restarted with backoff, or a streamable HTTP connection)."""

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import anyio
import httpx2
import mcp_types as types
import msgspec
import pydantic
import structlog
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from opentelemetry import trace

from runbus import __version__

from .errors import McpCallFailed

log = structlog.get_logger()

MCP_SEPARATOR: Final = "__"
"""Between a server's name and its tool's name in the runbus tool name (`time__get_time`)."""
BACKOFF_FIRST: Final = 0.5
"""Seconds before the first restart of a server that stopped; doubled each time after."""
CONNECT_WAIT: Final = 5.0
"""Seconds a call waits for a server that is (re)starting before it fails."""

SERVER_NAME: Final = r"^[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*$"


class McpServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One `[[mcp_servers]]` entry of the deployment's tool config."""

    name: Annotated[str, msgspec.Meta(pattern=SERVER_NAME, max_length=24)]
    """Namespace of its tools: `name__tool` (letters, digits, single `-` or `_`)."""
    command: str | None = None
    """stdio: the program each replica spawns (found on PATH, or a path)."""
    args: list[str] = []
    env: dict[str, str] = {}
    """Variables set for the program on top of a minimal environment (PATH, HOME, …)."""
    env_from: list[str] = []
    """Variables of the replica's own environment passed on to the program (a secret mounted
    as an environment variable), so the config file never holds them."""
    cwd: str | None = None
    url: str | None = None
    """Streamable HTTP: the server's MCP endpoint."""
    token_file: str | None = None
    """A file (a mounted secret) holding the bearer token sent to `url`; read at each connect."""
    token_env: str | None = None
    """An environment variable holding that token instead."""
    headers: dict[str, str] = {}
    """Other (non-secret) HTTP headers sent to `url`."""
    tools: list[str] | None = None
    """The server's tools to serve, by the server's own names; None serves them all."""
    read_only: list[str] | None = None
    """These tools change nothing and every other one does; None trusts the server's
    `readOnlyHint` / `idempotentHint` annotations."""
    approval: Literal["never", "always"] = "never"
    """Whether every call of these tools needs a person's approval first."""
    inject: dict[str, str] = {}
    """Argument → trusted run property (`user_id = "user_id"`): hidden from the model and
    filled from the run's headers, never from the model."""
    tenants: list[str] | None = None
    agents: list[str] | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Seconds a call may take (also capped by the run's deadline)."""
    startup_timeout: Annotated[float, msgspec.Meta(gt=0)] = 15.0
    """Seconds to connect and list tools before the attempt counts as failed."""
    ping_interval: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Seconds between pings of an idle session; a ping unanswered as long restarts it."""
    max_backoff: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Longest wait between restarts."""
    max_result_bytes: Annotated[int, msgspec.Meta(ge=256, le=512 * 1024)] = 64 * 1024

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"mcp server {self.name!r}: give `command` (stdio) or `url`, one")
        if self.command is None and (self.args or self.env or self.env_from or self.cwd):
            raise ValueError(f"mcp server {self.name!r}: args, env and cwd go with `command`")
        if self.url is None and (self.token_file or self.token_env or self.headers):
            raise ValueError(f"mcp server {self.name!r}: token and headers go with `url`")
        if self.token_file and self.token_env:
            raise ValueError(f"mcp server {self.name!r}: `token_file` or `token_env`, one")

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


ToolsListed = Callable[["McpServer", list[types.Tool]], Awaitable[None]]
"""Called with the server's whole tool list each time it is listed (connect, list change)."""


class McpServer:
    """One server's session on this replica, kept alive by a supervisor task."""

    def __init__(self, config: McpServerConfig, on_tools: ToolsListed) -> None:
        self.config = config
        self.name = config.name
        self.on_tools = on_tools
        self.session: ClientSession | None = None
        self.session_id: str | None = None
        """The `Mcp-Session-Id` a streamable HTTP server gave this session."""
        self.protocol_version: str | None = None
        self.restarts = 0
        self.last_error = ""
        self._ready = asyncio.Event()
        self._relist = asyncio.Event()
        self._lost = asyncio.Event()
        self._tried = asyncio.Event()
        """Set once the first attempt to connect succeeded or failed."""
        self._refused = ""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._supervise())

    async def wait_tried(self, timeout: float) -> bool:
        """Wait for the first connection attempt's outcome: ready or not."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._tried.wait()
        return self._ready.is_set()

    async def wait_ready(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        return self._ready.is_set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def call_tool(self, tool: str, arguments: Mapping[str, Any]) -> types.CallToolResult:
        """`tools/call` over the live session; a dropped connection or a non-MCP answer is an
        `McpCallFailed`. Cancelling the caller sends `notifications/cancelled`."""
        if self.session is None:
            await self.wait_ready(CONNECT_WAIT)
        session, lost = self.session, self._lost
        if session is None:
            problem = self.last_error or "still starting"
            raise McpCallFailed(self.name, f"is not connected ({problem})")
        span = trace.get_current_span()
        span.set_attribute("mcp.method.name", "tools/call")
        span.set_attribute("runbus.mcp.server", self.name)
        span.set_attribute("runbus.mcp.tool", tool)
        span.set_attribute(
            "network.transport", "pipe" if self.config.transport == "stdio" else "tcp"
        )
        if self.protocol_version:
            span.set_attribute("mcp.protocol.version", self.protocol_version)
        if self.session_id:
            span.set_attribute("mcp.session.id", self.session_id)
        try:
            return await session.call_tool(tool, dict(arguments))
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._down(lost)
                raise McpCallFailed(
                    self.name, "closed the connection during the call; it is being restarted"
                ) from None
            raise McpCallFailed(self.name, f"refused the call: {exc.error.message}") from None
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise McpCallFailed(
                self.name,
                f"answered with something that is not an MCP tool result ({where}: {first['msg']})",
            ) from None
        except (ValueError, RuntimeError) as exc:
            raise McpCallFailed(self.name, f"answered in a way runbus cannot use ({exc})") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._down(lost)
            raise McpCallFailed(self.name, "closed the connection during the call") from None

    def _down(self, lost: asyncio.Event) -> None:
        """The session `lost` belongs to is gone: calls wait for the next one from now on."""
        lost.set()
        if lost is self._lost:
            self._ready.clear()
            self.session = None

    async def _supervise(self) -> None:
        backoff = BACKOFF_FIRST
        while True:
            self._lost = asyncio.Event()
            self._refused = ""
            try:
                healthy_for = await self._session()
                reason = "closed the connection"
            except Exception as exc:
                healthy_for, reason = 0.0, _reason(exc)
                log.debug("mcp_session_failed", server=self.name, exc_info=exc)
            if self._refused:
                reason = f"{reason} ({self._refused})"
            self._tried.set()
            self._ready.clear()
            self.session = self.session_id = None
            self.last_error = reason
            if healthy_for > self.config.max_backoff:
                backoff = BACKOFF_FIRST
            log.warning(
                "mcp_server_down", server=self.name, reason=reason, restart_in=round(backoff, 2)
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.config.max_backoff)
            self.restarts += 1

    async def _session(self) -> float:
        """Connect, list, and serve until the connection is lost: seconds it was ready."""
        config = self.config
        async with contextlib.AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(self._transport(stack))
            # The session reads from this copy of the server's stream, so the end of the
            # server's output (it exited) is seen at once, not at the next call.
            mine, theirs = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            pump = asyncio.ensure_future(self._pump(read, mine, self._lost))
            stack.callback(pump.cancel)
            session = await stack.enter_async_context(
                ClientSession(
                    theirs,
                    write,
                    message_handler=self._on_message,
                    client_info=types.Implementation(name="runbus", version=__version__),
                )
            )
            async with asyncio.timeout(config.startup_timeout):
                initialized = await session.initialize()
                self.protocol_version = initialized.protocol_version
                await self._list(session)
            self.session = session
            self._ready.set()
            self._tried.set()
            ready_at = time.monotonic()
            log.info(
                "mcp_server_ready",
                server=self.name,
                server_info=initialized.server_info.name,
                protocol=initialized.protocol_version,
                restarts=self.restarts,
            )
            lost = self._lost
            while not lost.is_set():
                waits = [asyncio.ensure_future(e.wait()) for e in (lost, self._relist)]
                try:
                    done, _ = await asyncio.wait(
                        waits,
                        timeout=config.ping_interval,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for waiting in waits:
                        waiting.cancel()
                if lost.is_set():
                    break
                async with asyncio.timeout(config.ping_interval):
                    if self._relist.is_set():
                        self._relist.clear()
                        await self._list(session)
                    elif not done:
                        await session.send_ping()
            return time.monotonic() - ready_at

    @contextlib.asynccontextmanager
    async def _transport(self, stack: contextlib.AsyncExitStack) -> AsyncIterator[tuple[Any, Any]]:
        config = self.config
        if config.command is not None:
            passed = {name: os.environ[name] for name in config.env_from if name in os.environ}
            parameters = StdioServerParameters(
                command=config.command,
                args=config.args,
                env={**passed, **config.env},
                cwd=config.cwd,
            )
            async with stdio_client(parameters, errlog=sys.stderr) as streams:
                yield streams
            return
        assert config.url is not None
        headers = dict(config.headers)
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        client = await stack.enter_async_context(create_mcp_http_client(headers=headers))

        async def remember_session(response: httpx2.Response) -> None:
            if found := response.headers.get("mcp-session-id"):
                self.session_id = found
            if response.status_code >= 400:
                self._refused = f"HTTP {response.status_code} from {config.url}"

        client.event_hooks["response"].append(remember_session)
        async with streamable_http_client(config.url, http_client=client) as streams:
            yield streams

    def _token(self) -> str:
        config = self.config
        if config.token_file:
            try:
                return Path(config.token_file).read_text().strip()
            except OSError as exc:
                raise McpCallFailed(
                    self.name, f"has no token: cannot read {config.token_file} ({exc.strerror})"
                ) from None
        if config.token_env:
            token = os.environ.get(config.token_env, "").strip()
            if not token:
                raise McpCallFailed(self.name, f"has no token: {config.token_env} is not set")
            return token
        return ""

    async def _list(self, session: ClientSession) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            try:
                page = await session.list_tools(params=params)
            except pydantic.ValidationError as exc:
                # The SDK refuses a whole listing for one bad tool: serve none of them.
                log.error("mcp_tools_unusable", server=self.name, reason=_reason(exc)[:500])
                listed = []
                break
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        await self.on_tools(self, listed)

    async def _pump(self, read: Any, into: Any, lost: asyncio.Event) -> None:
        try:
            async with into:
                async for item in read:
                    await into.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self._down(lost)

    async def _on_message(self, message: IncomingMessage) -> None:
        match message:
            case types.ToolListChangedNotification():
                log.info("mcp_tools_changed", server=self.name)
                self._relist.set()
            case Exception():
                # A line that is not JSON-RPC (stdio), a failed HTTP exchange: the call it
                # belonged to, if any, ends at its timeout; a dead server fails its next ping.
                log.warning("mcp_transport_error", server=self.name, error=str(message)[:200])


def _reason(exc: BaseException) -> str:
    """What went wrong, told by the innermost failures (anyio wraps them in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(_reason(e) for e in exc.exceptions))
    if isinstance(exc, TimeoutError):
        return "did not answer in time (connect, list or ping)"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")
