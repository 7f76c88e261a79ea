"""The tool catalog every deployment writes its tools into, so any replica of any deployment
answers `runbus.tools.list` with the tools of all of them."""

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Protocol

import msgspec

from runbus.headers import RunContext
from runbus.messages import ToolSpec

from .registry import Tool, visible

REFRESH_EVERY: Final = 60.0
"""Seconds between a replica's rewrites of its tools' entries."""
STALE_AFTER: Final = 3 * REFRESH_EVERY
"""An entry nobody rewrote for this long belongs to a deployment that is gone."""


class CatalogEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as the catalog knows it: its schema and who may see it."""

    spec: ToolSpec
    side_effect: bool
    tenants: list[str] | None = None
    agents: list[str] | None = None
    refreshed_at: float
    """Seconds since the epoch of the last rewrite by a live replica."""

    def visible_to(self, ctx: RunContext) -> bool:
        return visible(self.tenants, self.agents, ctx)


CATALOG_ENTRY_DECODER = msgspec.json.Decoder(CatalogEntry)


def entry_for(tool: Tool, now: float | None = None) -> CatalogEntry:
    return CatalogEntry(
        spec=tool.spec(),
        side_effect=tool.side_effect,
        tenants=None if tool.tenants is None else sorted(tool.tenants),
        agents=None if tool.agents is None else sorted(tool.agents),
        refreshed_at=time.time() if now is None else now,
    )


class CatalogStore(Protocol):
    async def publish(self, entries: Iterable[CatalogEntry]) -> None: ...

    async def get(self, names: Sequence[str]) -> list[CatalogEntry]:
        """Entries of those names that exist, in any order."""
        ...

    async def all(self) -> list[CatalogEntry]: ...


async def select(
    local: Mapping[str, Tool],
    store: CatalogStore | None,
    names: Sequence[str] | None,
    ctx: RunContext,
    now: float | None = None,
) -> list[ToolSpec]:
    """The specs the run may see: this replica's own tools first-hand, the rest from the
    catalog; in the order asked for (by name when all are listed)."""
    now = time.time() if now is None else now
    found = {name: entry_for(tool, now) for name, tool in local.items()}
    if store is not None:
        if names is None:
            remote = await store.all()
        else:
            missing = [n for n in names if n not in found]
            remote = await store.get(missing) if missing else []
        for entry in remote:
            if entry.spec.name not in found and now - entry.refreshed_at <= STALE_AFTER:
                found[entry.spec.name] = entry
    wanted = sorted(found) if names is None else names
    return [
        found[name].spec
        for name in dict.fromkeys(wanted)
        if name in found and found[name].visible_to(ctx)
    ]
