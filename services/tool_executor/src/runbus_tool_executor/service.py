"""The tool executor service: one endpoint per tool, the catalog, and run cancellation."""

import asyncio
import contextlib
import importlib
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Self

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from opentelemetry.sdk.trace import TracerProvider

from runbus import blobs, ops, subjects
from runbus.bus import heartbeats
from runbus.cancels import parse_cancel
from runbus.errors import BadRequest
from runbus.headers import RunContext
from runbus.messages import ToolCatalog, ToolInvoke, ToolInvoked, ToolList
from runbus.service import DEFAULT_OPTIONS, Endpoint, Service, ServiceOptions
from runbus.settings import Settings

from .catalog import REFRESH_EVERY, CatalogStore, entry_for, select
from .config import Deployment, load_deployment
from .errors import ToolDefinitionError, UnknownTool
from .executor import Executor
from .mcp_tools import McpTool, McpToolSource
from .middleware import Middleware
from .registry import Tool, ToolRegistry
from .store import open_stores


def load_registries(modules: str) -> list[ToolRegistry]:
    """The `tools` registry of each comma-separated module."""
    registries = []
    for name in filter(None, (m.strip() for m in modules.split(","))):
        registry = getattr(importlib.import_module(name), "tools", None)
        if not isinstance(registry, ToolRegistry):
            raise ToolDefinitionError(f"module {name!r} has no `tools` ToolRegistry")
        registries.append(registry)
    return registries


class ToolExecutorService(Service):
    name = "tool_executor"
    description = "Typed tools: validation, trusted identity, middleware, approval, idempotency"

    def __init__(
        self,
        nc: NATS,
        registries: list[ToolRegistry],
        *,
        deployment: Deployment | None = None,
        middleware: Sequence[Middleware] | None = None,
        tool_root: Path | None = None,
        stream_replicas: int = 1,
        options: ServiceOptions = DEFAULT_OPTIONS,
    ) -> None:
        """`middleware` (else the deployment's chain, else the packages' own) runs for every
        call this replica serves."""
        super().__init__(nc, options=options)
        deployment = deployment or Deployment()
        tools: dict[str, Tool] = {}
        for registry in registries:
            for name, tool in registry.tools.items():
                if name in tools:
                    raise ToolDefinitionError(f"tool {name!r} is served by two registries")
                tools[name] = tool
        if middleware is None:
            middleware = deployment.middleware
        if middleware is None:
            middleware = [m for registry in registries for m in registry.middleware]
        self.tools = deployment.apply(tools)
        self.stream_replicas = stream_replicas
        self.executor = Executor(
            middleware=middleware,
            root=tool_root,
            approval_ttl=deployment.approval_ttl,
            # A little under the hop timeout, so the caller still gets the reply.
            max_timeout=self.bus.request_timeout - min(1.0, self.bus.request_timeout / 10),
            replica=f"{socket.gethostname()}:{os.getpid()}:{id(self):x}",
            tracer=self.tracer,
        )
        self.deployment = deployment
        self.mcp = McpToolSource(
            deployment.mcp_servers,
            self._mcp_tools_changed,
            store_blob=lambda data, media_type: blobs.put(nc, data, media_type),
        )
        self._served: set[str] | None = None
        """Tools with an endpoint on this replica, once it listens (an MCP tool's endpoint is
        added when the tool appears)."""
        self._listen_lock = asyncio.Lock()
        self.catalog: CatalogStore | None = None
        self._cancels: Subscription | None = None
        self._refresh: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        root = Path(settings.tool_root) if settings.tool_root else settings.data_path / "files"
        root.mkdir(parents=True, exist_ok=True)
        return cls(
            nc,
            load_registries(settings.tool_modules),
            deployment=load_deployment(Path(settings.tool_config))
            if settings.tool_config
            else None,
            tool_root=root,
            stream_replicas=settings.stream_replicas,
            options=ServiceOptions(
                tracer_provider=tracer_provider, request_timeout=settings.request_timeout
            ),
        )

    async def on_start(self) -> None:
        calls, catalog = await open_stores(self.nc, replicas=self.stream_replicas)
        self.executor.calls, self.catalog = calls, catalog
        await catalog.publish(entry_for(t) for t in self.tools.values())
        self._refresh = asyncio.ensure_future(self._keep_catalog_fresh(catalog))
        self._cancels = await self.nc.subscribe(subjects.CANCEL_ALL, cb=self.on_cancel)
        await self.mcp.start()

    async def on_listening(self) -> None:
        await self._listen_to_new_tools()

    async def stop(self) -> None:
        if self._cancels is not None:
            with contextlib.suppress(Exception):
                await self._cancels.unsubscribe()
            self._cancels = None
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresh
            self._refresh = None
        await super().stop()

    async def on_stop(self) -> None:
        await self.executor.finish_started()
        await self.mcp.stop()

    def endpoints(self) -> list[Endpoint]:
        if self._served is None:
            self._served = set(self.tools)
        invoke = [
            Endpoint.for_op(ops.TOOL_INVOKE.at(name), self._invoker(name))
            for name in sorted(self._served)
        ]
        return [Endpoint.for_op(ops.TOOLS_LIST, self.on_list), *invoke]

    async def on_list(self, ctx: RunContext, request: ToolList) -> ToolCatalog:
        return ToolCatalog(tools=await select(self.tools, self.catalog, request.names, ctx))

    async def on_invoke(
        self, ctx: RunContext, request: ToolInvoke, subject_tool: str
    ) -> ToolInvoked:
        if request.name != subject_tool:
            raise BadRequest(
                f"the body names tool {request.name[:64]!r} but was sent to {subject_tool!r}",
                details={"field": "name"},
            )
        tool = self.tools.get(request.name)
        if tool is None:
            raise UnknownTool(request.name)
        if not request.call_id:
            raise BadRequest("call_id must not be empty", details={"field": "call_id"})
        # A caller that listens for progress learns the tool is still running, so a long
        # tool is bounded by its own timeout instead of the hop's.
        return await heartbeats(self.nc, ctx.progress, self.executor.invoke(tool, request, ctx))

    async def on_cancel(self, msg: Msg) -> None:
        if (named := parse_cancel(msg.subject)) is not None:
            self.executor.cancel_run(*named)

    async def _mcp_tools_changed(self, server: str, tools: dict[str, McpTool]) -> None:
        """A server's tools as it lists them now replace the ones it listed before."""
        for name, tool in list(self.tools.items()):
            if isinstance(tool, McpTool) and tool.server == server and name not in tools:
                del self.tools[name]
        taken = sorted(
            n for n in tools if n in self.tools and not isinstance(self.tools[n], McpTool)
        )
        if taken:
            self.log.warning("mcp_tool_name_taken", server=server, tools=taken)
        fresh = {
            name: self.deployment.override(tool)
            for name, tool in tools.items()
            if name not in taken
        }
        self.tools.update(fresh)
        if self.catalog is not None:
            try:
                await self.catalog.publish(entry_for(t) for t in fresh.values())
            except Exception:
                self.log.warning("tool_catalog_publish_failed", server=server, exc_info=True)
        if self._served is not None:
            await self._listen_to_new_tools()

    async def _listen_to_new_tools(self) -> None:
        """An endpoint for each tool that appeared since the service started; a tool that
        went away keeps its endpoint, which answers that no such tool is served."""
        async with self._listen_lock:
            assert self._served is not None
            for name in sorted(set(self.tools) - self._served):
                await self.listen(Endpoint.for_op(ops.TOOL_INVOKE.at(name), self._invoker(name)))
                self._served.add(name)
            await self.nc.flush()

    def _invoker(self, name: str) -> Callable[[RunContext, ToolInvoke], Awaitable[ToolInvoked]]:
        async def invoke(ctx: RunContext, request: ToolInvoke) -> ToolInvoked:
            return await self.on_invoke(ctx, request, name)

        return invoke

    async def _keep_catalog_fresh(self, catalog: CatalogStore) -> None:
        while True:
            await asyncio.sleep(REFRESH_EVERY)
            try:
                await catalog.publish(entry_for(t) for t in self.tools.values())
            except Exception:
                self.log.warning("tool_catalog_refresh_failed", exc_info=True)
