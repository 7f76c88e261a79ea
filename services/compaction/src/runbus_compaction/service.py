"""The compaction service: returns the prompt with its groups and token estimates.

Strategies that remove or summarise groups come with the compaction issue; until then the
prompt comes back whole (`compacted=False`). Persisted history is never touched here.
"""

from typing import Self

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import subjects
from runbus.headers import RunContext
from runbus.messages import CompactRequest, CompactResult
from runbus.messages.compaction import COMPACT_REQUEST_DECODER
from runbus.service import Endpoint, Service
from runbus.settings import Settings

from .core import group_messages


class CompactionService(Service):
    name = "compaction"
    description = "Shrinks what the model sees: groups, token estimates, strategies"

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(nc, tracer_provider=tracer_provider, request_timeout=settings.request_timeout)

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint(
                "compact", subjects.COMPACTION_COMPACT, COMPACT_REQUEST_DECODER, self.on_compact
            )
        ]

    async def on_compact(self, ctx: RunContext, request: CompactRequest) -> CompactResult:
        groups = group_messages(request.messages)
        return CompactResult(
            messages=request.messages,
            groups=groups,
            total_tokens=sum(g.tokens for g in groups),
            compacted=False,
        )
