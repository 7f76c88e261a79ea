"""The tool catalogue an agent's runs offer the model, asked once per agent and tenant and kept
for a short while, instead of one `tools.list` hop per run."""

import time
from collections.abc import Awaitable, Callable
from typing import Final

from runbus.messages import ToolSpec

CATALOG_TTL: Final = 30.0
"""Seconds a catalogue is reused: a tool deployed or removed shows up within this; a call to a
tool the executor no longer knows drops it at once."""

CatalogKey = tuple[str, str, tuple[str, ...]]
"""Agent, tenant (tools may be visible to some tenants only) and the tool names asked for."""


class ToolCatalogCache:
    def __init__(self, ttl: float = CATALOG_TTL) -> None:
        self.ttl = ttl
        self._entries: dict[CatalogKey, tuple[float, list[ToolSpec]]] = {}

    async def get(
        self, key: CatalogKey, fetch: Callable[[], Awaitable[list[ToolSpec]]]
    ) -> list[ToolSpec]:
        """The cached catalogue, or a fresh one (a failed fetch is never cached)."""
        now = time.monotonic()
        found = self._entries.get(key)
        if found is not None and found[0] > now:
            return found[1]
        tools = await fetch()
        self._entries[key] = (now + self.ttl, tools)
        return tools

    def forget(self, agent: str, tenant: str) -> None:
        """Ask again next time: the executor refused a tool this catalogue offered."""
        for key in [k for k in self._entries if k[:2] == (agent, tenant)]:
            del self._entries[key]
