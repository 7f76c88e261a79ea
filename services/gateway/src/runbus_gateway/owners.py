"""Who owns each run id: the first owner (tenant + user) to use it claims it at admission, by
compare-and-set, on every replica at once; no request of another owner reaches that run."""

from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js.kv import KeyValue

from runbus import subjects
from runbus.jetstream import open_bucket
from runbus.kv import TypedBucket
from runbus.owners import Owner

from .errors import RunIdTaken
from .runs import RECORD_TTL

CLAIM_ATTEMPTS: Final = 4
_DECODER = msgspec.json.Decoder(Owner)


class RunOwners:
    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, _DECODER)

    @classmethod
    async def open(cls, nc: NATS, *, replicas: int = 1) -> "RunOwners":
        # As long as run records: an id is never free again while its record can be read.
        return cls(
            await open_bucket(nc, subjects.RUN_OWNERS_BUCKET, ttl=RECORD_TTL, replicas=replicas)
        )

    async def claim(self, run_id: str, tenant: str, user_id: str) -> None:
        """Make `run_id` this owner's, or confirm it already is (a redelivery); raise
        `RunIdTaken` when another owner holds it."""
        mine = Owner(tenant, user_id)
        for _ in range(CLAIM_ATTEMPTS):
            if await self.bucket.create(run_id, mine) is not None:
                return
            holder = await self.bucket.value(run_id)
            if holder is None:
                continue  # expired between the two calls: claim again
            if holder == mine:
                return
            raise RunIdTaken(run_id)
        raise RunIdTaken(run_id)
