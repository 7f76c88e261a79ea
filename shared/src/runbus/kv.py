"""Typed access to a JetStream KV bucket: values of one msgspec type, read with their revision,
written by compare-and-set; a lost race is a return value, not an exception to catch."""

from collections.abc import Callable
from typing import Final, Generic, TypeVar

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from .jetstream import next_update

T = TypeVar("T")

SCAN_TIMEOUT: Final = 5.0
"""Seconds `values` waits for each next entry of a scan before it gives up."""
_ENCODER: Final = msgspec.json.Encoder()


class KeptChanging(RuntimeError):
    """Other writers changed the key between every read and write of `TypedBucket.change`."""

    def __init__(self, key: str, attempts: int) -> None:
        super().__init__(f"{key!r} kept changing; gave up after {attempts} tries")
        self.key = key
        self.attempts = attempts


class TypedBucket(Generic[T]):
    """A KV bucket (or one family of its keys) whose values are JSON of one type.

    `kv` stays reachable for what is not typed here (watching a key).
    """

    def __init__(self, kv: KeyValue, decoder: msgspec.json.Decoder[T]) -> None:
        self.kv = kv
        self._decoder = decoder

    def decode(self, data: bytes) -> T:
        return self._decoder.decode(data)

    def encode(self, value: T) -> bytes:
        return _ENCODER.encode(value)

    async def get(self, key: str) -> tuple[T, int] | None:
        """The value and its revision; None when there is none (or it is empty)."""
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return self.decode(entry.value), entry.revision or 0

    async def value(self, key: str) -> T | None:
        found = await self.get(key)
        return None if found is None else found[0]

    async def put(self, key: str, value: T) -> int:
        """Write whatever is there; the new revision."""
        return await self.kv.put(key, self.encode(value))

    async def create(self, key: str, value: T) -> int | None:
        """Write if the key holds nothing; the new revision, or None if it holds a value."""
        try:
            return await self.kv.create(key, self.encode(value))
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            # nats-py answers a create that lost the race by reading the key, and a replica
            # still catching up may not have it yet: either way the key holds a value.
            return None

    async def update(self, key: str, value: T, revision: int) -> int | None:
        """Write if the key is still at `revision`; the new revision, or None if it moved on."""
        try:
            return await self.kv.update(key, self.encode(value), last=revision)
        except KeyWrongLastSequenceError:
            return None

    async def change(
        self, key: str, change: Callable[[T | None], T | None], *, attempts: int
    ) -> T | None:
        """Apply `change` to the stored value (None: nothing stored) by compare-and-set, read
        again whenever another writer won; what it wrote, or None when `change` declined
        (returned None). `KeptChanging` after `attempts` lost races."""
        for _ in range(attempts):
            found = await self.get(key)
            changed = change(None if found is None else found[0])
            if changed is None:
                return None
            if found is None:
                written = await self.create(key, changed)
            else:
                written = await self.update(key, changed, found[1])
            if written is not None:
                return changed
        raise KeptChanging(key, attempts)

    async def purge(self, key: str) -> None:
        """Drop the key and its history."""
        await self.kv.purge(key)

    async def keys(self, pattern: str = ">") -> list[str]:
        """Keys matching the subject-style `pattern` (`acme.*`), filtered by the server.

        nats-py's `KeyValue.keys(filters=...)` watches the whole bucket and matches substrings
        client-side, which is slow and would let `acme.` match a tenant named `bigacme`.
        """
        watcher = await self.kv.watch(pattern, ignore_deletes=True, meta_only=True)
        keys: list[str] = []
        try:
            async for entry in watcher:
                if entry is None:
                    break
                keys.append(entry.key)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return keys

    async def values(self, pattern: str = ">") -> list[T]:
        """The values of every key matching `pattern`, read in one pass."""
        watcher = await self.kv.watch(pattern, ignore_deletes=True)
        values = []
        try:
            while True:
                entry = await next_update(watcher, timeout=SCAN_TIMEOUT)
                if entry is None:
                    break
                if entry.value:
                    values.append(self.decode(entry.value))
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return values
