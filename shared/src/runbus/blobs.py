"""Large content by reference: a part over the threshold is stored once in a JetStream object
store and travels as a `runbus-blob://<sha256>` URI, so no bus message nears NATS's max
payload and history keeps the reference, not the bytes. Only a consumer that needs the bytes
(the model router, building a provider request) resolves it."""

import hashlib
from typing import Final

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from . import subjects
from .errors import NotFound
from .messages import ChatMessage, DataContent, UriContent

SCHEME: Final = "runbus-blob://"
THRESHOLD: Final = 256 * 1024
"""Bytes above which a data part is stored by reference (NATS's default max payload is 1 MiB)."""


async def _store(nc: NATS, *, replicas: int = 1) -> ObjectStore:
    js = nc.jetstream()
    try:
        return await js.object_store(subjects.BLOBS_BUCKET)
    except BucketNotFoundError:
        return await js.create_object_store(subjects.BLOBS_BUCKET, replicas=replicas)


async def put(nc: NATS, data: bytes, media_type: str) -> UriContent:
    """Store `data` once (content-addressed) and return its reference."""
    name = hashlib.sha256(data).hexdigest()
    store = await _store(nc)
    try:
        await store.get_info(name)
    except NotFoundError:
        await store.put(name, data)
    return UriContent(uri=f"{SCHEME}{name}", media_type=media_type)


async def get(nc: NATS, uri: str) -> bytes:
    """The bytes behind a `runbus-blob://` reference."""
    if not uri.startswith(SCHEME):
        raise NotFound(f"not a blob reference: {uri[:80]!r}")
    try:
        result = await (await _store(nc)).get(uri[len(SCHEME) :])
    except NotFoundError:
        raise NotFound(f"no blob {uri[:80]!r}") from None
    return result.data or b""


async def offload(nc: NATS, messages: list[ChatMessage]) -> list[ChatMessage]:
    """`messages` with every data part over the threshold replaced by a reference."""
    out = []
    for message in messages:
        contents = [
            await put(nc, part.data, part.media_type)
            if isinstance(part, DataContent) and len(part.data) > THRESHOLD
            else part
            for part in message.contents
        ]
        out.append(msgspec.structs.replace(message, contents=contents))
    return out


async def resolve(nc: NATS, messages: list[ChatMessage]) -> list[ChatMessage]:
    """`messages` with every blob reference replaced by its bytes (for a provider request)."""
    out = []
    for message in messages:
        if not any(_is_blob(p) for p in message.contents):
            out.append(message)
            continue
        contents = [
            DataContent(data=await get(nc, part.uri), media_type=part.media_type or "")
            if isinstance(part, UriContent) and _is_blob(part)
            else part
            for part in message.contents
        ]
        out.append(msgspec.structs.replace(message, contents=contents))
    return out


def _is_blob(part: object) -> bool:
    return isinstance(part, UriContent) and part.uri.startswith(SCHEME)
