"""A typed KV bucket: values of one type with their revision, compare-and-set writes whose lost
races are return values, and the bytes stored exactly as msgspec's JSON of the value."""

import msgspec
import pytest
from nats.aio.client import Client as NATS

from runbus.jetstream import open_bucket
from runbus.kv import KeptChanging, TypedBucket


class Counter(msgspec.Struct, frozen=True):
    name: str
    count: int = 0


DECODER = msgspec.json.Decoder(Counter)


async def bucket(nc: NATS) -> TypedBucket[Counter]:
    return TypedBucket(await open_bucket(nc, "runbus_typed_test"), DECODER)


async def test_a_value_is_read_back_with_its_revision_and_stored_as_its_json(nc: NATS) -> None:
    counters = await bucket(nc)

    revision = await counters.put("a", Counter("a", 1))

    assert await counters.get("a") == (Counter("a", 1), revision)
    assert await counters.value("a") == Counter("a", 1)
    assert (await counters.kv.get("a")).value == b'{"name":"a","count":1}'
    assert await counters.get("missing") is None


async def test_create_writes_only_where_nothing_is_stored(nc: NATS) -> None:
    counters = await bucket(nc)

    first = await counters.create("a", Counter("a", 1))
    second = await counters.create("a", Counter("a", 2))

    assert first is not None
    assert second is None
    assert await counters.value("a") == Counter("a", 1)


async def test_an_update_from_a_revision_that_moved_on_writes_nothing(nc: NATS) -> None:
    counters = await bucket(nc)
    revision = await counters.put("a", Counter("a", 1))
    await counters.put("a", Counter("a", 2))

    assert await counters.update("a", Counter("a", 3), revision) is None
    assert await counters.value("a") == Counter("a", 2)


class Overtaken(TypedBucket[Counter]):
    """Another writer adds 10 between each read and write of the first `races` updates."""

    def __init__(self, counters: TypedBucket[Counter], races: int) -> None:
        super().__init__(counters.kv, DECODER)
        self.races = races

    async def update(self, key: str, value: Counter, revision: int) -> int | None:
        if self.races > 0:
            self.races -= 1
            current = await self.value(key)
            assert current is not None
            await self.put(key, Counter(current.name, current.count + 10))
        return await super().update(key, value, revision)


def add_one(counter: Counter | None) -> Counter:
    assert counter is not None
    return Counter(counter.name, counter.count + 1)


async def test_a_change_reads_again_after_losing_a_race(nc: NATS) -> None:
    counters = await bucket(nc)
    await counters.put("a", Counter("a", 1))

    changed = await Overtaken(counters, races=1).change("a", add_one, attempts=3)

    assert changed == Counter("a", 12)
    assert await counters.value("a") == Counter("a", 12)


async def test_a_change_of_nothing_stored_creates_the_value_and_may_decline(nc: NATS) -> None:
    counters = await bucket(nc)

    created = await counters.change("new", lambda c: c or Counter("new", 1), attempts=2)
    declined = await counters.change("new", lambda c: None, attempts=2)

    assert created == Counter("new", 1)
    assert declined is None
    assert await counters.value("new") == Counter("new", 1)


async def test_a_change_that_loses_every_race_gives_up_with_kept_changing(nc: NATS) -> None:
    counters = await bucket(nc)
    await counters.put("a", Counter("a", 1))

    with pytest.raises(KeptChanging) as raised:
        await Overtaken(counters, races=3).change("a", add_one, attempts=3)

    assert (raised.value.key, raised.value.attempts) == ("a", 3)
    assert await counters.value("a") == Counter("a", 31)


async def test_keys_and_values_are_listed_by_pattern(nc: NATS) -> None:
    counters = await bucket(nc)
    for key in ("acme.a", "acme.b", "bigacme.c"):
        await counters.put(key, Counter(key))

    assert sorted(await counters.keys("acme.*")) == ["acme.a", "acme.b"]
    assert sorted(c.name for c in await counters.values("acme.*")) == ["acme.a", "acme.b"]
    await counters.purge("acme.a")
    assert await counters.keys("acme.*") == ["acme.b"]
