"""The compaction service: shrinks the prompt copy with the strategy the request names and
reports what it did, on the reply and on the span. Persisted history is never touched here.

Summaries are asked of the model router (`runbus.model.complete`) on the strategy's route, as a
child span of this request, so they show in the run's trace and usage.
"""

from typing import Final, Self

from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.util.types import AttributeValue

from runbus import ops
from runbus.headers import RunContext
from runbus.messages import CompactRequest, CompactResult, ModelRequest
from runbus.messages.compaction import CompactionReport
from runbus.service import Endpoint, Service, ServiceOptions
from runbus.settings import Settings

from .strategies import SummaryCall, SummaryReply, compact
from .tokens import counter_for

SPAN_ID_LIMIT: Final = 64
"""Excluded message ids put on the span at most (the count is always there)."""


class CompactionService(Service):
    name = "compaction"
    description = "Shrinks what the model sees: groups, token estimates, strategies"

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        return cls(
            nc,
            options=ServiceOptions(
                tracer_provider=tracer_provider, request_timeout=settings.request_timeout
            ),
        )

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint.for_op(ops.COMPACTION_COMPACT, self.on_compact)]

    async def on_compact(self, ctx: RunContext, request: CompactRequest) -> CompactResult:
        async def summarize(call: SummaryCall) -> SummaryReply:
            return await self._summarize(ctx, call)

        result = await compact(
            request.messages,
            request.strategy,
            counter=counter_for(request.tokenizer),
            summarize=summarize,
            max_tokens=request.max_tokens,
        )
        report = result.report
        trace.get_current_span().set_attributes(span_attributes(report))
        failures = [s.error.code for s in report.steps if s.error is not None]
        if result.compacted or failures:
            self.log.info(
                "prompt_compacted",
                strategy=report.strategy,
                steps=[s.path for s in report.steps if s.compacted],
                failures=failures,
                tokens_before=report.tokens_before,
                tokens_after=report.tokens_after,
                messages_before=report.messages_before,
                messages_after=report.messages_after,
            )
        return CompactResult(
            messages=result.messages,
            groups=result.groups,
            total_tokens=result.total_tokens,
            compacted=result.compacted,
            report=report,
        )

    async def _summarize(self, ctx: RunContext, call: SummaryCall) -> SummaryReply:
        # Half of what the run has left at most, so a slow summary still leaves time to answer
        # with the prompt unchanged instead of failing the whole request.
        left = ctx.time_left()
        wait = call.timeout if left is None else max(0.0, min(call.timeout, left / 2))
        with self.tracer.start_as_current_span(
            f"summarize {call.route}",
            attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": call.route},
        ):
            reply = await self.bus.call(
                ops.MODEL_COMPLETE,
                ModelRequest(route=call.route, messages=call.messages),
                ctx=ctx,
                timeout=wait or None,
            )
        return SummaryReply(text=reply.message.text, usage=reply.usage)


def span_attributes(report: CompactionReport) -> dict[str, AttributeValue]:
    """The report as attributes of the request's span."""
    excluded = report.excluded_message_ids
    return {
        "runbus.compaction.strategy": report.strategy,
        "runbus.compaction.tokenizer": report.tokenizer,
        "runbus.compaction.compacted": any(s.compacted for s in report.steps),
        "runbus.compaction.steps": [
            f"{s.path}:{s.strategy}:{_outcome(s.triggered, s.compacted, s.error is not None)}"
            for s in report.steps
        ],
        "runbus.compaction.groups.before": report.groups_before,
        "runbus.compaction.groups.after": report.groups_after,
        "runbus.compaction.messages.before": report.messages_before,
        "runbus.compaction.messages.after": report.messages_after,
        "runbus.compaction.tokens.before": report.tokens_before,
        "runbus.compaction.tokens.after": report.tokens_after,
        "runbus.compaction.excluded_messages": len(excluded),
        "runbus.compaction.excluded_message_ids": excluded[:SPAN_ID_LIMIT],
        "runbus.compaction.added_message_ids": report.added_message_ids[:SPAN_ID_LIMIT],
        "runbus.compaction.repaired_message_ids": report.repaired_message_ids[:SPAN_ID_LIMIT],
        "runbus.compaction.failures": [
            f"{s.path}:{s.error.code}: {s.error.message}"
            for s in report.steps
            if s.error is not None
        ],
    }


def _outcome(triggered: bool, compacted: bool, failed: bool) -> str:
    if failed:
        return "failed"
    if compacted:
        return "compacted"
    return "triggered" if triggered else "skipped"
