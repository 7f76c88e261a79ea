"""A deployment's tool policy (`RUNBUS_TOOL_CONFIG`): its middleware chain and per-tool
overrides of what the tool packages declare.

```toml
approval_ttl = 600                      # seconds an approver has (default 900)

[[middleware]]                          # the whole chain, in order; replaces the packages' own
use = "runbus_examples.travel:corporate_policy"
blocked = ["VA823", "JQ"]               # every other key is an argument of the factory

[tools.create_booking]
approval = "always"                     # never | always | default (the tool's own rule)
timeout = 5.0
tenants = ["acme"]                      # only these tenants see and may call it
agents = ["travel"]

[[mcp_servers]]                         # tools of MCP servers (docs/services/mcp.md)
name = "time"                           # tools are served as `time__<tool>`
command = "mcp-server-time"             # stdio: each replica spawns and supervises it
args = ["--local-timezone", "UTC"]
```
"""

import importlib
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from .errors import ToolConfigError
from .mcp_servers import MCP_SEPARATOR, McpServerConfig
from .middleware import DEFAULT_APPROVAL_TTL, Middleware
from .registry import Tool

T = TypeVar("T", bound=Tool)


class ToolOverride(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    approval: Literal["never", "always", "default"] = "default"
    timeout: Annotated[float, msgspec.Meta(gt=0)] | None = None
    tenants: list[str] | None = None
    agents: list[str] | None = None
    max_result_bytes: Annotated[int, msgspec.Meta(ge=1, le=512 * 1024)] | None = None


class ConfigFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    approval_ttl: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_APPROVAL_TTL
    middleware: list[dict[str, Any]] | None = None
    tools: dict[str, ToolOverride] = {}
    mcp_servers: list[McpServerConfig] = []


@dataclass(frozen=True)
class Deployment:
    """What a deployment says about its tools; the default says nothing."""

    middleware: list[Middleware] | None = None
    """The chain, or None to use the chain the tool packages recommend."""
    overrides: dict[str, ToolOverride] | None = None
    approval_ttl: float = DEFAULT_APPROVAL_TTL
    mcp_servers: list[McpServerConfig] = field(default_factory=list)
    """MCP servers whose tools this deployment serves besides its Python ones."""

    def apply(self, tools: dict[str, Tool]) -> dict[str, Tool]:
        """The tools with this deployment's overrides; naming a tool not served is an error
        (an MCP server's tools are known only once it answers, so those are overridden then)."""
        overrides = self.overrides or {}
        prefixes = tuple(f"{server.name}{MCP_SEPARATOR}" for server in self.mcp_servers)
        unknown = sorted(n for n in set(overrides) - set(tools) if not n.startswith(prefixes))
        if unknown:
            raise ToolConfigError("tools", f"names tools this deployment does not serve: {unknown}")
        return {name: self.override(tool) for name, tool in tools.items()}

    def override(self, tool: T) -> T:
        """`tool` with this deployment's override of its name, if any."""
        override = (self.overrides or {}).get(tool.name)
        if override is None:
            return tool
        return replace(
            tool,
            approval=tool.approval if override.approval == "default" else override.approval,
            timeout=override.timeout or tool.timeout,
            tenants=tool.tenants if override.tenants is None else frozenset(override.tenants),
            agents=tool.agents if override.agents is None else frozenset(override.agents),
            max_result_bytes=override.max_result_bytes or tool.max_result_bytes,
        )


def load_deployment(path: Path) -> Deployment:
    source = str(path)
    try:
        config = msgspec.convert(tomllib.loads(path.read_text()), ConfigFile)
    except OSError as exc:
        raise ToolConfigError(source, f"cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ToolConfigError(source, str(exc)) from None
    middleware = None
    if config.middleware is not None:
        middleware = [_middleware(source, i, entry) for i, entry in enumerate(config.middleware)]
    names = [server.name for server in config.mcp_servers]
    if len(set(names)) != len(names):
        raise ToolConfigError(source, f"mcp_servers: each name once, not {names}")
    return Deployment(
        middleware=middleware,
        overrides=dict(config.tools),
        approval_ttl=config.approval_ttl,
        mcp_servers=list(config.mcp_servers),
    )


def _middleware(source: str, index: int, entry: dict[str, Any]) -> Middleware:
    """`use = "module:factory"` called with the entry's other keys."""
    options = dict(entry)
    reference = options.pop("use", None)
    where = f"middleware[{index}]"
    if not isinstance(reference, str) or ":" not in reference:
        raise ToolConfigError(source, f"{where}.use must be 'module:factory', not {reference!r}")
    module_name, _, attribute = reference.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ToolConfigError(source, f"{where}.use {reference!r}: {exc}") from None
    try:
        middleware = factory(**options)
    except TypeError as exc:
        raise ToolConfigError(source, f"{where} ({reference}): {exc}") from None
    if not callable(middleware):
        raise ToolConfigError(source, f"{where} ({reference}) did not return a middleware")
    return middleware  # type: ignore[no-any-return]
