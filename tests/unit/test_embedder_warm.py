"""The memory service warms its lazy embedder at start: the model loads once, before any
search; a load that fails there is logged and tried again at first use."""

import structlog

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
