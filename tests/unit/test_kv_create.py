"""A create that lost the race is told so, however nats-py reports it."""

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from runbus.kv import TypedBucket
from runbus.messages.runs import RUN_EVENT_DECODER


class LosingKV:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def create(self, key: str, value: bytes) -> int:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        KeyWrongLastSequenceError(description="wrong last sequence: 12"),
        # What nats-py raises when, after the wrong last sequence, its own read of the key is
        # answered by a replica that does not have it yet.
        KeyNotFoundError(),
    ],
)
async def test_a_create_of_a_key_that_holds_a_value_answers_none(error: Exception) -> None:
    bucket = TypedBucket(LosingKV(error), RUN_EVENT_DECODER)  # type: ignore[arg-type]

    assert await bucket.create("k", None) is None
