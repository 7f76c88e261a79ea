"""Who owns each run id: the first owner (tenant + user) to use it claims it at admission, by
compare-and-set, on every replica at once; no request of another owner reaches that run."""

from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.jetstream import open_bucket

from .errors import RunIdTaken
from .runs import RECORD_TTL

CLAIM_ATTEMPTS: Final = 4


class Owner(msgspec.Struct, frozen=True, kw_only=True):
    tenant: str
    user_id: str


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(Owner)


class RunOwners:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "RunOwners":
        # As long as run records: an id is never free again while its record can be read.
        return cls(
            await open_bucket(nc, subjects.RUN_OWNERS_BUCKET, ttl=RECORD_TTL, replicas=replicas)
        )

    async def claim(self, run_id: str, tenant: str, user_id: str) -> None:
        """Make `run_id` this owner's, or confirm it already is (a redelivery); raise
        `RunIdTaken` when another owner holds it."""
        mine = Owner(tenant=tenant, user_id=user_id)
        for _ in range(CLAIM_ATTEMPTS):
            try:
                await self.kv.create(run_id, _ENCODER.encode(mine))
                return
            except KeyWrongLastSequenceError:
                pass
            try:
                entry = await self.kv.get(run_id)
            except KeyNotFoundError:
                continue  # expired between the two calls: claim again
            if entry.value and _DECODER.decode(entry.value) == mine:
                return
            raise RunIdTaken(run_id)
        raise RunIdTaken(run_id)
