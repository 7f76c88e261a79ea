"""Start and stop the six services in-process for tests and benchmarks."""

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from runbus.service import Service
from runbus.telemetry import create_tracer_provider
from runbus_compaction.service import CompactionService
from runbus_gateway.agents import AgentSpec, load_agents
from runbus_gateway.auth import TokenVerifier
from runbus_gateway.service import GatewayService
from runbus_history.service import HistoryService
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.service import MemoryService
from runbus_model_router.backends import ModelBackend
from runbus_model_router.scripted import ScriptedReply
from runbus_model_router.service import ModelRouterService, default_routes
from runbus_tool_executor.service import ToolExecutorService
from runbus_tool_executor.travel import tools as travel_tools

SERVICE_NAMES = ("gateway", "history", "memory", "compaction", "model_router", "tool_executor")


@dataclass
class Stack:
    url: str
    services: dict[str, Service]
    connections: list[NATS]
    exit_stack: AsyncExitStack
    providers: dict[str, TracerProvider] = field(default_factory=dict)

    async def start_service(self, service_factory: type[Service], **kwargs: object) -> Service:
        """Start one more replica (its own connection) and stop it with the stack."""
        nc = await nats.connect(self.url)
        self.exit_stack.push_async_callback(nc.drain)
        service = service_factory(nc, **kwargs)  # type: ignore[call-arg]
        await service.start()
        self.exit_stack.push_async_callback(service.stop)
        return service


@asynccontextmanager
async def start_stack(
    url: str,
    *,
    data_dir: Path,
    processor: SpanProcessor | None = None,
    agents: dict[str, AgentSpec] | None = None,
    scripts: dict[str, list[ScriptedReply]] | None = None,
    routes: dict[str, ModelBackend] | None = None,
) -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exit_stack:
        providers = {}
        for name in SERVICE_NAMES:
            providers[name] = create_tracer_provider(
                name, processors=[processor] if processor else []
            )
        stack = Stack(
            url=url, services={}, connections=[], exit_stack=exit_stack, providers=providers
        )
        memory_store = await EdgeStore.open(data_dir / "qdrant", HashingEmbedder().dimension)
        factories: dict[str, tuple[type[Service], dict[str, object]]] = {
            "history": (HistoryService, {}),
            "memory": (MemoryService, {"embedder": HashingEmbedder(), "store": memory_store}),
            "compaction": (CompactionService, {}),
            "model_router": (
                ModelRouterService,
                {"routes": routes or default_routes(scripts or {})},
            ),
            "tool_executor": (ToolExecutorService, {"registries": [travel_tools]}),
            "gateway": (
                GatewayService,
                {"agents": agents or load_agents(), "verifier": TokenVerifier.from_file()},
            ),
        }
        for name in SERVICE_NAMES[1:] + SERVICE_NAMES[:1]:
            factory, kwargs = factories[name]
            stack.services[name] = await stack.start_service(
                factory, tracer_provider=providers[name], **kwargs
            )
        yield stack
