"""Start and stop the six services in-process for tests and benchmarks, on a nats-server (or a
3-node cluster) secured as in production (accounts, service credentials, the auth callout)."""

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from runbus import busauth, subjects
from runbus.embedded import EmbeddedNats, EmbeddedNatsCluster
from runbus.service import DEFAULT_OPTIONS, Service, ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus.tokens import TokenVerifier
from runbus_auth.service import CREDENTIAL_TTL, AuthService
from runbus_compaction.service import CompactionService
from runbus_examples import AGENTS_DIR
from runbus_examples.models import default_routes
from runbus_examples.scripted import ScriptedReply
from runbus_examples.travel import tools as travel_tools
from runbus_gateway.agents import AgentSpec, load_agents
from runbus_gateway.service import GatewayService
from runbus_history.service import HistoryService
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.service import MemoryService
from runbus_model_router.backends import ModelBackend
from runbus_model_router.config import RouterConfig
from runbus_model_router.service import ModelRouterService
from runbus_tool_executor.registry import ToolRegistry
from runbus_tool_executor.service import ToolExecutorService

SERVICE_NAMES = ("gateway", "history", "memory", "compaction", "model_router", "tool_executor")


@dataclass
class SecuredNats:
    """A nats-server with the production auth and its callout responder in-process.

    `url` carries the service credential (a test acting as a service connects with it);
    `client_url` carries none: a client presents its token (`runbus.client.connect`)."""

    server: EmbeddedNats
    secrets: busauth.StackSecrets
    auth: AuthService
    client_url: str

    @property
    def url(self) -> str:
        credentials = busauth.Credentials(busauth.SERVICE_USER, self.secrets.service_password)
        return _with_credentials(self.client_url, credentials)

    @property
    def data_dir(self) -> Path:
        return self.server.store_dir.parent


def service_url(url: str, data_dir: Path) -> str:
    """`url` of a stack `runbus up` started under `data_dir`, with the service credential (for
    a test acting as a service)."""
    credentials = busauth.stack_credentials(data_dir, busauth.SERVICE_USER)
    assert credentials is not None, f"no service credential under {data_dir}"
    return _with_credentials(url, credentials)


@asynccontextmanager
async def secured_nats(
    data_dir: Path, verifier: TokenVerifier | None = None, *, credential_ttl: float | None = None
) -> AsyncIterator[SecuredNats]:
    """`runbus up`'s bus: generated secrets, the auth callout, and the auth service (with
    the dev tokens unless `verifier` says otherwise, and the default lifetime of the users it
    issues unless `credential_ttl` does)."""
    secrets = busauth.StackSecrets.load_or_create(data_dir)
    config = busauth.write_server_config(data_dir, secrets)
    with EmbeddedNats(data_dir / "jetstream", config_file=config) as server:
        async with answering_the_callout(
            server.url, secrets, verifier, credential_ttl=credential_ttl
        ) as auth:
            yield SecuredNats(server=server, secrets=secrets, auth=auth, client_url=server.url)


@asynccontextmanager
async def answering_the_callout(
    url: str | list[str],
    secrets: busauth.StackSecrets,
    verifier: TokenVerifier | None = None,
    connect_options: Mapping[str, Any] | None = None,
    *,
    credential_ttl: float | None = None,
) -> AsyncIterator[AuthService]:
    """The auth service on its own connection (any node of a cluster will do: the callout
    requests of every node reach it over the routes)."""
    nc = await nats.connect(
        url,
        user=busauth.AUTH_USER,
        password=secrets.auth_password,
        inbox_prefix=subjects.SERVICE_INBOX_PREFIX,
        **(connect_options or {}),
    )
    auth = AuthService(
        nc,
        verifier=verifier or TokenVerifier.from_file(),
        issuer_seed=secrets.issuer_seed,
        credential_ttl=credential_ttl or CREDENTIAL_TTL,
    )
    await auth.start()
    try:
        yield auth
    finally:
        await auth.stop()
        await _drain(nc)


def _with_credentials(url: str, credentials: busauth.Credentials) -> str:
    host = url.removeprefix("nats://")
    return f"nats://{credentials.user}:{credentials.password}@{host}"


@dataclass
class SecuredCluster:
    """`EmbeddedNatsCluster` with the production auth on every node and the auth service
    in-process, one replica per node. A test acting as a service connects to `client_urls`
    with `service_login`; a client with its token."""

    cluster: EmbeddedNatsCluster
    secrets: busauth.StackSecrets
    auth: list[AuthService]

    @property
    def client_urls(self) -> list[str]:
        return self.cluster.urls

    @property
    def service(self) -> busauth.Credentials:
        return busauth.Credentials(busauth.SERVICE_USER, self.secrets.service_password)

    @property
    def service_login(self) -> dict[str, object]:
        """`nats.connect` options of the service credential. Not in the URLs: nats-py
        reconnects to the nodes a server announces too, with these options, never with the
        credentials of another URL."""
        return {"user": self.service.user, "password": self.service.password}


@asynccontextmanager
async def secured_cluster(
    root: Path, data_dir: Path, **connect_options: object
) -> AsyncIterator[SecuredCluster]:
    """A 3-node cluster under `root` with the stack secrets of `data_dir`, as `secured_nats`
    runs one server. `connect_options` go to the auth services' connections (their reconnect
    policy when a node stops)."""
    secrets = busauth.StackSecrets.load_or_create(data_dir)
    config = busauth.write_server_config(data_dir, secrets)
    with EmbeddedNatsCluster(root, config_file=config) as cluster:
        async with AsyncExitStack() as replicas:
            # One replica on each node first, as a deployment runs two or more: whichever node
            # stops, a client that reconnects finds the callout answered (a refused reconnect
            # is retried, but nats-py leaks the socket of each refused attempt).
            urls = cluster.urls
            auth = [
                await replicas.enter_async_context(
                    answering_the_callout(
                        [*urls[index:], *urls[:index]],
                        secrets,
                        connect_options={"dont_randomize": True, **connect_options},
                    )
                )
                for index in range(len(urls))
            ]
            yield SecuredCluster(cluster=cluster, secrets=secrets, auth=auth)


async def _drain(nc: NATS) -> None:
    # A test may have closed a connection on purpose to play a dying replica.
    if not nc.is_closed:
        await nc.drain()


@dataclass
class Stack:
    url: str | list[str]
    """One server, or every node of a cluster (each connection picks one, fails over)."""
    services: dict[str, Service]
    connections: list[NATS]
    exit_stack: AsyncExitStack
    providers: dict[str, TracerProvider] = field(default_factory=dict)
    connect_options: dict[str, object] = field(default_factory=dict)
    """Extra `nats.connect` options of every service connection (reconnect policy)."""
    options: dict[str, ServiceOptions] = field(default_factory=dict)
    """Options of each service by name: its tracer provider and the stack's hop timeout."""

    async def start_service(self, service_factory: type[Service], **kwargs: object) -> Service:
        """Start one more replica (its own connection, the stack's options for that service)
        and stop it with the stack. `kwargs` are the service's own constructor arguments."""
        nc = await nats.connect(self.url, **self.connect_options)
        self.exit_stack.push_async_callback(_drain, nc)
        options = self.options.get(service_factory.name, DEFAULT_OPTIONS)
        service = service_factory(nc, options=options, **kwargs)
        await service.start()
        self.exit_stack.push_async_callback(service.stop)
        return service


@asynccontextmanager
async def start_stack(
    url: str | list[str],
    *,
    data_dir: Path,
    processor: SpanProcessor | None = None,
    agents: dict[str, AgentSpec] | None = None,
    scripts: dict[str, list[ScriptedReply]] | None = None,
    routes: dict[str, ModelBackend] | None = None,
    stream_replicas: int = 1,
    request_timeout: float | None = None,
    connect_options: dict[str, object] | None = None,
    gateway_options: Mapping[str, object] | None = None,
    tool_registries: list[ToolRegistry] | None = None,
    router_config: RouterConfig | None = None,
) -> AsyncIterator[Stack]:
    """The six services in-process. `stream_replicas` goes to every service that creates
    JetStream streams or KV buckets; `request_timeout` caps every bus hop."""
    async with AsyncExitStack() as exit_stack:
        providers = {}
        for name in SERVICE_NAMES:
            providers[name] = create_tracer_provider(
                name, processors=[processor] if processor else []
            )
        stack = Stack(
            url=url,
            services={},
            connections=[],
            exit_stack=exit_stack,
            providers=providers,
            connect_options=connect_options or {},
        )
        for name, provider in providers.items():
            stack.options[name] = ServiceOptions(
                tracer_provider=provider,
                request_timeout=request_timeout or DEFAULT_OPTIONS.request_timeout,
            )
        replicated: dict[str, object] = (
            {"replicas": stream_replicas} if stream_replicas != 1 else {}
        )
        # model_router and tool_executor name the same setting `stream_replicas`.
        kv_replicated: dict[str, object] = (
            {"stream_replicas": stream_replicas} if stream_replicas != 1 else {}
        )
        memory_store = await EdgeStore.open(data_dir / "qdrant", HashingEmbedder().dimension)
        factories: dict[str, tuple[type[Service], dict[str, object]]] = {
            "history": (HistoryService, {**replicated}),
            "memory": (
                MemoryService,
                {"embedder": HashingEmbedder(), "store": memory_store, **replicated},
            ),
            "compaction": (CompactionService, {}),
            "model_router": (
                ModelRouterService,
                {
                    "routes": routes or default_routes(scripts or {}),
                    "config": router_config,
                    **kv_replicated,
                },
            ),
            "tool_executor": (
                ToolExecutorService,
                {"registries": tool_registries or [travel_tools], **kv_replicated},
            ),
            "gateway": (
                GatewayService,
                {
                    "agents": agents or load_agents(AGENTS_DIR),
                    "verifier": TokenVerifier.from_file(),
                    # A run failing `unavailable` fails for good after 4 deliveries (3.5 s of
                    # backoff), not the 30 s a cluster election needs: tests of failures stay
                    # quick (the default is tested in tests/unit/test_retry_window.py).
                    "retry_window": 3.5,
                    **replicated,
                    **(gateway_options or {}),
                },
            ),
        }
        for name in SERVICE_NAMES[1:] + SERVICE_NAMES[:1]:
            factory, kwargs = factories[name]
            stack.services[name] = await stack.start_service(factory, **kwargs)
        yield stack
