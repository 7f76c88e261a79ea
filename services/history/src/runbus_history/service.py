"""The history service: thin handlers over `core` (rules) and `store` (JetStream)."""

import re
from typing import Self

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import subjects
from runbus.headers import RunContext
from runbus.messages import HistoryAppend, HistoryAppended, HistoryLoad, HistoryLoaded
from runbus.messages.history import HISTORY_APPEND_DECODER, HISTORY_LOAD_DECODER
from runbus.service import Endpoint, Service
from runbus.settings import Settings

from . import core, store
from .errors import MissingIdentity

SAFE_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")


class HistoryService(Service):
    name = "history"
    description = "Chat history per session, on JetStream"

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(nc, tracer_provider=tracer_provider, request_timeout=settings.request_timeout)

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("append", subjects.HISTORY_APPEND, HISTORY_APPEND_DECODER, self.on_append),
            Endpoint("load", subjects.HISTORY_LOAD, HISTORY_LOAD_DECODER, self.on_load),
        ]

    async def on_start(self) -> None:
        await store.ensure_stream(self.nc)

    async def on_append(self, ctx: RunContext, request: HistoryAppend) -> HistoryAppended:
        subject = self._subject(ctx, request.session_id)
        to_store, skipped = core.messages_to_store(request.messages)
        if not to_store:
            return HistoryAppended(stored=0, skipped=skipped)
        data = core.BATCH_ENCODER.encode(core.StoredBatch(messages=to_store))
        fresh = await store.append(self.nc, subject, data, core.batch_id(subject, to_store))
        if not fresh:
            return HistoryAppended(stored=0, skipped=len(request.messages))
        return HistoryAppended(stored=len(to_store), skipped=skipped)

    async def on_load(self, ctx: RunContext, request: HistoryLoad) -> HistoryLoaded:
        subject = self._subject(ctx, request.session_id)
        left = ctx.time_left()
        timeout = self.bus.request_timeout if left is None else min(left, self.bus.request_timeout)
        batches = [
            core.BATCH_DECODER.decode(data)
            async for data in store.read_subject(self.nc, subject, timeout)
        ]
        return HistoryLoaded(messages=core.loaded(batches))

    @staticmethod
    def _subject(ctx: RunContext, session_id: str) -> str:
        tenant = ctx.prop("tenant")
        if not tenant or not SAFE_TOKEN.fullmatch(tenant):
            raise MissingIdentity()
        return subjects.history_log(tenant, session_id)
