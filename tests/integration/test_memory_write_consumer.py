"""Memory's write consumer outlives what a NATS cluster does to a pull: with the writes stream
and its consumer left without a quorum (pulls answer 503 or find no responder) it keeps
pulling, and once the nodes are back it stores the next write."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client as NATS

from runbus import subjects
from runbus.embedded import EmbeddedNatsCluster
from runbus.headers import RunContext
from runbus.messages import MemoryStore, encode
from runbus.service import ServiceOptions
from runbus.telemetry import create_tracer_provider
from runbus_memory.core import StorageScope
from runbus_memory.edge import EdgeStore
from runbus_memory.embedder import HashingEmbedder
from runbus_memory.service import MemoryService
from tests.helpers import eventually

RECONNECT: Final[dict[str, object]] = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.2}
ALICE: Final = RunContext(
    run_id="r-mem", session_id="s-mem", agent="travel", props={"tenant": "acme", "user_id": "alice"}
)

pytestmark = pytest.mark.slow  # a three-node cluster that loses its quorum


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    with EmbeddedNatsCluster(tmp_path / "cluster") as running:
        yield running


@pytest.fixture
async def memory(cluster: EmbeddedNatsCluster, tmp_path: Path) -> AsyncIterator[MemoryService]:
    nc = await nats.connect(cluster.urls, **RECONNECT)
    embedder = HashingEmbedder()
    service = MemoryService(
        nc,
        embedder=embedder,
        store=await EdgeStore.open(tmp_path / "qdrant", embedder.dimension),
        replicas=3,
        options=ServiceOptions(tracer_provider=create_tracer_provider("memory")),
    )
    await service.start()
    yield service
    await service.stop()
    await nc.close()


async def _write(nc: NATS, index: int) -> None:
    headers = {**ALICE.to_headers(), "Nats-Msg-Id": f"w-{index}"}
    body = encode(MemoryStore(texts=[f"I prefer aisle seats on route {index}."]))

    async def published() -> bool:
        await nc.jetstream().publish(subjects.MEMORY_WRITES, body, headers=headers, timeout=1)
        return True

    # The stream may be electing a leader when the nodes come back.
    retrying = (nats.errors.Error, nats.js.errors.Error)
    await eventually(published, 30, retrying=retrying, what="the write was published")


async def test_the_write_consumer_keeps_storing_across_a_lost_quorum(
    cluster: EmbeddedNatsCluster, memory: MemoryService
) -> None:
    nc = await nats.connect(cluster.urls, **RECONNECT)
    scope = StorageScope.from_context(ALICE)
    try:
        await _write(nc, 1)
        await eventually(lambda: memory.memories.count(scope), 20, what="the first write")
        info = await nc.jetstream().consumer_info(
            subjects.MEMORY_WRITES_STREAM, subjects.MEMORY_WRITES_CONSUMER
        )
        assert info.cluster is not None
        names = [node.name for node in cluster.nodes]
        leader = names.index(str(info.cluster.leader))
        down = [leader, (leader + 1) % len(names)]
        writes = memory._writes
        assert writes is not None
        failures = writes.pull_failures

        for index in down:
            cluster.stop_node(index)
        await eventually(lambda: writes.pull_failures > failures, 30, what="a refused pull")
        for index in down:
            cluster.restart_node(index)
        await _write(nc, 2)

        async def both_stored() -> bool:
            return await memory.memories.count(scope) == 2

        await eventually(both_stored, 60, what="the write after the outage")
    finally:
        await nc.close()
