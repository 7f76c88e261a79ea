"""The tool executor service: one endpoint per tool, plus the catalog."""

import importlib
from typing import Self

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import subjects
from runbus.errors import BadRequest
from runbus.headers import RunContext
from runbus.messages import ToolCatalog, ToolInvoke, ToolInvoked, ToolList
from runbus.messages.tools import TOOL_INVOKE_DECODER, TOOL_LIST_DECODER
from runbus.service import Endpoint, Service
from runbus.settings import Settings

from .errors import ToolDefinitionError, UnknownTool
from .registry import Tool, ToolRegistry


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
    description = "Typed tools with validation and trusted-argument injection"

    def __init__(self, nc: NATS, registries: list[ToolRegistry], **kwargs: object) -> None:
        super().__init__(nc, **kwargs)  # type: ignore[arg-type]
        self.tools: dict[str, Tool] = {}
        for registry in registries:
            for name, tool in registry.tools.items():
                if name in self.tools:
                    raise ToolDefinitionError(f"tool {name!r} is served by two registries")
                self.tools[name] = tool

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(
            nc,
            load_registries(settings.tool_modules),
            tracer_provider=tracer_provider,
            request_timeout=settings.request_timeout,
        )

    def endpoints(self) -> list[Endpoint]:
        invoke = [
            Endpoint(
                f"invoke-{name}",
                subjects.tool_invoke(name),
                TOOL_INVOKE_DECODER,
                self.on_invoke,
                span_subject=subjects.TOOL_INVOKE_TEMPLATE,
            )
            for name in self.tools
        ]
        return [Endpoint("list", subjects.TOOLS_LIST, TOOL_LIST_DECODER, self.on_list), *invoke]

    async def on_list(self, ctx: RunContext, request: ToolList) -> ToolCatalog:
        names = self.tools.keys() if request.names is None else request.names
        return ToolCatalog(tools=[self.tools[n].spec() for n in names if n in self.tools])

    async def on_invoke(self, ctx: RunContext, request: ToolInvoke) -> ToolInvoked:
        tool = self.tools.get(request.name)
        if tool is None:
            raise UnknownTool(request.name)
        if not request.call_id:
            raise BadRequest("call_id must not be empty")
        with self.tracer.start_as_current_span(
            f"execute_tool {tool.name}",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool.name,
                "gen_ai.tool.call.id": request.call_id,
            },
        ) as span:
            result = await tool.invoke(request.call_id, request.arguments, ctx)
            if result.error is not None:
                span.set_attribute("error.type", "tool_error")
        return ToolInvoked(result=result)
