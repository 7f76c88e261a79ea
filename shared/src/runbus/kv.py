"""JetStream KV helpers shared by the services that keep records in buckets."""

from nats.js.kv import KeyValue


async def keys_matching(kv: KeyValue, pattern: str) -> list[str]:
    """Keys matching the subject-style `pattern` (`acme.*`), filtered by the server.

    nats-py's `KeyValue.keys(filters=...)` watches the whole bucket and matches substrings
    client-side, which is slow and would let `acme.` match a tenant named `bigacme`.
    """
    watcher = await kv.watch(pattern, ignore_deletes=True, meta_only=True)
    keys: list[str] = []
    try:
        async for entry in watcher:
            if entry is None:
                break
            keys.append(entry.key)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return keys
