"""JetStream setup and KV helpers every service shares: make a stream or bucket exist with
the wanted config (idempotent across replicas starting at once), list keys by pattern."""

from nats.aio.client import Client as NATS
from nats.js.api import StreamConfig
from nats.js.errors import BadRequestError, BucketNotFoundError
from nats.js.kv import KeyValue


async def ensure_stream(nc: NATS, config: StreamConfig) -> None:
    """Create the stream, or bring an existing one to `config`."""
    js = nc.jetstream()
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.update_stream(config)


async def open_bucket(
    nc: NATS, bucket: str, *, replicas: int = 1, ttl: float | None = None, history: int = 1
) -> KeyValue:
    """The KV bucket, created on first use."""
    js = nc.jetstream()
    try:
        return await js.key_value(bucket)
    except BucketNotFoundError:
        try:
            return await js.create_key_value(
                bucket=bucket, history=history, ttl=ttl, replicas=replicas
            )
        except BadRequestError:  # another replica created it a moment ago
            return await js.key_value(bucket)


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
