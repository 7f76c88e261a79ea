"""Where a person waits on the first search (`runbus up`, `runbus demo`), memory warms its
lazy embedder at start: the model loads once, before any search; a load that fails there is
logged and tried again at first use. Elsewhere it loads at first use (small while unused)."""

import structlog

from runbus.settings import load_settings
from runbus.supervisor import warm_memory_env
from runbus_memory.embedder import HashingEmbedder, LazyEmbedder


async def test_warming_loads_the_model_once_so_the_first_use_does_not() -> None:
    loads = 0

    async def load() -> HashingEmbedder:
        nonlocal loads
        loads += 1
        return HashingEmbedder(384)

    embedder = LazyEmbedder("hashing", 384, load)

    await embedder.warm()
    loaded_before_use = (embedder.loaded, loads)
    await embedder.embed(["a window seat"])

    assert loaded_before_use == (True, 1)
    assert loads == 1


async def test_a_warm_up_that_fails_is_logged_and_the_first_use_tries_again() -> None:
    attempts = 0

    async def load() -> HashingEmbedder:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("model file missing")
        return HashingEmbedder(384)

    embedder = LazyEmbedder("hashing", 384, load)
    with structlog.testing.capture_logs() as logs:
        await embedder.warm()

    assert [entry["event"] for entry in logs if entry["event"] == "embedder_warm_failed"] == [
        "embedder_warm_failed"
    ]
    assert not embedder.loaded
    assert len(await embedder.embed(["x"])) == 1
    assert attempts == 2


def test_runbus_up_warms_every_memory_replica_unless_the_setting_is_given() -> None:
    assert warm_memory_env({}, {"memory": 2}) == {
        "memory": {"RUNBUS_EMBEDDER_WARM": "true"},
        "memory#2": {"RUNBUS_EMBEDDER_WARM": "true"},
    }
    assert warm_memory_env({"RUNBUS_EMBEDDER_WARM": "false"}, {"memory": 2}) == {}
    assert load_settings({"RUNBUS_EMBEDDER_WARM": "true"}).embedder_warm
    assert not load_settings({}).embedder_warm
