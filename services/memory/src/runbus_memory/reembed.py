"""Changing the embedder of an embedded store: the memories of a shard made by another
embedder are embedded again, none lost and no two models' vectors in one shard.

Every memory keeps its text in its payload, so its vector can be made again by any model. At
start, a shard whose recorded embedder is not the configured one is moved aside (one rename),
a new shard is made in its place, every memory of the old one — retired ones too, with their
ids, dates and statuses — is embedded and written into it, and the old shard is deleted. A
crash part-way leaves the old shard aside, and the next start finishes the copy (writes by
memory id: a memory copied twice is stored once). Switching back re-embeds the other way."""

import asyncio
import json
import shutil
from pathlib import Path
from typing import Final

import structlog

from .edge import CONFIG_FILE, EMBEDDER_FILE, EdgeStore, persisted_size
from .embedder import Embedder
from .errors import StoreUnreadable
from .stores import EMBEDDER_KEY, UNRECORDED_EMBEDDER

log = structlog.get_logger()

PAGE: Final = 256
"""Memories read, embedded and written at a time."""
ASIDE: Final = ".reembedding"
"""Suffix of the old shard's directory while its memories are copied."""
DONE: Final = ".reembedded"
"""Suffix of the old shard's directory once copied, while it is deleted."""


async def open_edge(path: Path, embedder: Embedder) -> EdgeStore:
    """The shard at `path` for `embedder`, its memories embedded again first if another
    embedder made it (or a copy of them was cut short)."""
    aside = path.with_name(path.name + ASIDE)
    done = path.with_name(path.name + DONE)
    if done.exists():
        await asyncio.to_thread(shutil.rmtree, done)
    if not aside.exists():
        recorded = await asyncio.to_thread(recorded_embedder, path)
        if recorded is None or recorded == embedder.name:
            return await EdgeStore.open(path, embedder.dimension, embedder=embedder.name)
        log.warning("memory_reembedding", store=str(path), made_by=recorded, embedder=embedder.name)
        path.rename(aside)
    copied = await _copy(aside, path, embedder)
    aside.rename(done)
    await asyncio.to_thread(shutil.rmtree, done)
    log.warning("memory_reembedded", store=str(path), memories=copied, embedder=embedder.name)
    return await EdgeStore.open(path, embedder.dimension, embedder=embedder.name)


def recorded_embedder(path: Path) -> str | None:
    """The embedder of the shard at `path`; None when there is no shard there yet."""
    if not (path / CONFIG_FILE).exists():
        return None
    try:
        recorded = json.loads((path / EMBEDDER_FILE).read_text()).get(EMBEDDER_KEY)
    except (OSError, ValueError, AttributeError):
        # A shard older than the marker: made by the only embedder runbus had then (an empty
        # one is copied in no time).
        return UNRECORDED_EMBEDDER
    return str(recorded) if recorded is not None else None


async def _copy(source: Path, target: Path, embedder: Embedder) -> int:
    size = persisted_size(source)
    if size is None:
        raise StoreUnreadable(str(source), "its vector size is not recorded")
    old = await EdgeStore.open(source, size)
    new = await EdgeStore.open(target, embedder.dimension, embedder=embedder.name)
    copied = 0
    try:
        cursor: str | None = None
        while True:
            records, cursor = await old.scroll({}, PAGE, cursor, retired=True)
            if records:
                vectors = await embedder.embed([r.text for r in records])
                await new.upsert(records, vectors)
                copied += len(records)
            if cursor is None:
                return copied
    finally:
        await new.close()  # flushed before the old shard goes
        await old.close()
