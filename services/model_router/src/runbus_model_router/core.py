"""The router without NATS: budget check, plan, then each target in turn behind its guard, with
retries, backoff, `Retry-After`, circuit breakers, the tool-argument repair turn and usage.

A call falls back to the next target only while nothing has been streamed: once a delta is out,
a second model's answer would not continue the first one's sentence.
"""

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Final, Protocol

import msgspec
import structlog

from runbus.headers import RunContext
from runbus.messages import (
    ChatMessage,
    FunctionResultContent,
    ModelRequest,
    ModelResponse,
    ReasoningContent,
    Usage,
    is_identifier,
)

from .backends import OnDelta
from .config import RouterConfig, TargetConfig
from .errors import (
    BadToolArguments,
    ContextTooLong,
    InvalidToolArguments,
    ModelUnavailable,
    ProviderFailure,
    ProviderUnavailable,
    StreamBroken,
    TargetMisconfigured,
)
from .features import check_tools, without_reasoning
from .middleware import ChatMiddleware, ModelCall, chain
from .resilience import CircuitBreaker, TargetGuard
from .routing import Plan, RouteTable, Target
from .usage import UNKNOWN, Labels, UsageLedger, check_budget, price, row, utc_day

log = structlog.get_logger()

REPAIR_INSTRUCTION: Final = (
    "Your arguments for {name} were not a valid JSON object ({problem}). "
    "Call the tool again with valid JSON arguments."
)
NOT_RUN_REPAIR: Final = (
    "Not run: another call in the same reply had unreadable arguments. Send the calls again."
)


class Provenance(Protocol):
    """Which provider family wrote the reasoning in an assistant message (by message id)."""

    def remember(self, message_id: str, family: str) -> None: ...

    async def families(self, message_ids: list[str]) -> dict[str, str]: ...


def has_reasoning(message: ChatMessage) -> bool:
    return any(isinstance(p, ReasoningContent) for p in message.contents)


class Router:
    def __init__(
        self,
        table: RouteTable,
        config: RouterConfig,
        *,
        ledger: UsageLedger,
        provenance: Provenance,
        middleware: Sequence[ChatMiddleware] = (),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        today: Callable[[], str] = utc_day,
    ) -> None:
        self.table = table
        self.config = config
        self.ledger = ledger
        self.provenance = provenance
        self.sleep = sleep
        self.today = today
        self.guards = {
            t.key: TargetGuard(
                concurrency=t.config.concurrency,
                requests_per_second=(t.config.requests_per_minute or 0) / 60 or None,
                burst=t.config.burst,
                tokens_per_second=(t.config.tokens_per_minute or 0) / 60 or None,
                breaker=CircuitBreaker(t.config.breaker_failures, t.config.breaker_cooldown),
            )
            for t in table.targets()
        }
        self._send = chain(middleware, self._backend)

    @staticmethod
    async def _backend(call: ModelCall) -> ModelResponse:
        return await call.target.backend.complete(call.request, call.on_delta)

    async def complete(
        self, ctx: RunContext, request: ModelRequest, on_delta: OnDelta
    ) -> ModelResponse:
        check_tools(request.tools)
        plan = self.table.plan(request, ctx)
        day = self.today()
        first = plan.attempts[0][0]
        await check_budget(
            self.config,
            self.ledger,
            day,
            ctx.prop("tenant") or UNKNOWN,
            estimated_tokens=plan.features.tokens,
            estimated_cost=price(first.config, plan.features.tokens, 0),
        )
        streamed = False

        async def tracked(text: str) -> None:
            nonlocal streamed
            streamed = True
            await on_delta(text)

        failures: list[str] = []
        too_long: ContextTooLong | None = None
        other_failure = False
        for target, prepared in plan.attempts:
            guard = self.guards[target.key]
            if plan.features.has_reasoning:
                prepared = await self._reasoning_for(target, prepared)
            prepared = with_target_settings(prepared, target.config)
            for attempt in range(target.config.retries + 1):
                if not guard.breaker.try_acquire():
                    failures.append(f"{target.key}: circuit open")
                    other_failure = True
                    break
                try:
                    async with guard.slot(plan.features.tokens):
                        call = ModelCall(ctx, plan.route.name, target, prepared, tracked, attempt)
                        response = await self._with_repair(call, plan)
                except ContextTooLong as exc:
                    # Says nothing about the target's health; a target with a larger context
                    # may still take the prompt, so the route moves on without retrying here.
                    guard.breaker.release()
                    failures.append(f"{target.key}: {exc.reason}")
                    log.info(
                        "model_target_context_too_long",
                        target=target.key,
                        prompt_tokens=exc.prompt_tokens,
                        context_tokens=exc.context_tokens,
                        provider=exc.provider,
                    )
                    if streamed:
                        raise StreamBroken(target.key, exc.reason) from None
                    too_long = exc
                    break
                except ProviderFailure as exc:
                    if isinstance(exc, ProviderUnavailable | TargetMisconfigured):
                        guard.breaker.record_failure()
                    else:
                        guard.breaker.release()
                        raise
                    failures.append(f"{target.key}: {exc.reason}")
                    other_failure = True
                    log.info(
                        "model_target_failed",
                        target=target.key,
                        attempt=attempt,
                        reason=exc.reason,
                        breaker=guard.breaker.state,
                    )
                    if streamed:
                        raise StreamBroken(target.key, exc.reason) from None
                    wait = self._wait_before_retry(exc, target, attempt)
                    left = ctx.time_left()
                    if wait is None or (left is not None and wait >= left):
                        break
                    await self.sleep(wait)
                    continue
                except BaseException:
                    guard.breaker.release()
                    raise
                guard.breaker.record_success()
                return self._finish(ctx, plan, target, request, response, day)
        if too_long is not None and not other_failure:
            raise too_long  # each target tried refused the prompt as too long for it
        raise ModelUnavailable(plan.route.name, failures)

    @staticmethod
    def _wait_before_retry(exc: ProviderFailure, target: Target, attempt: int) -> float | None:
        """Seconds to wait before the next try at `target`, or None to move on."""
        limits = target.config
        if attempt >= limits.retries or not isinstance(exc, ProviderUnavailable):
            return None
        if exc.retry_after is not None:
            return exc.retry_after if exc.retry_after <= limits.max_retry_after else None
        backoff = min(limits.max_backoff, limits.backoff * 2.0**attempt)
        return backoff * random.uniform(0.5, 1.0)

    async def _with_repair(self, call: ModelCall, plan: Plan) -> ModelResponse:
        """Send the call; when the model writes unreadable tool arguments, show it the error
        next to its own call and ask again, up to the route's `repair_attempts`."""
        spent = Usage()
        for repair in range(plan.route.repair_attempts + 1):
            try:
                response = await self._send(call)
            except BadToolArguments as exc:
                spent = spent + exc.usage
                log.info("tool_arguments_unreadable", target=call.target.key, repair=repair)
                if repair == plan.route.repair_attempts:
                    raise InvalidToolArguments(list(exc.problems.values())) from None
                call = dataclasses.replace(
                    call, request=_repair_turn(call.request, exc.reply, exc.problems)
                )
                continue
            return msgspec.structs.replace(response, usage=response.usage + spent)
        raise AssertionError("unreachable")

    async def _reasoning_for(self, target: Target, request: ModelRequest) -> ModelRequest:
        """Keep reasoning only where this target's family wrote it and can read it back."""
        with_reasoning = [m.message_id for m in request.messages if has_reasoning(m)]
        if target.reasoning_field is None:
            return without_reasoning(request, lambda _: False)
        families = await self.provenance.families(with_reasoning)
        return without_reasoning(request, lambda m: families.get(m.message_id) == target.family)

    def _finish(
        self,
        ctx: RunContext,
        plan: Plan,
        target: Target,
        request: ModelRequest,
        response: ModelResponse,
        day: str,
    ) -> ModelResponse:
        usage = response.usage
        cost = price(target.config, usage.input_tokens, usage.output_tokens)
        labels = Labels.of(ctx, plan.route.name, target.model)
        self.ledger.record(day, row(labels, usage.input_tokens, usage.output_tokens, cost))
        message = response.message
        if request.message_id:
            message = msgspec.structs.replace(message, message_id=request.message_id)
            if has_reasoning(message) and is_identifier(request.message_id):
                self.provenance.remember(request.message_id, target.family)
        log.info(
            "model_call_completed",
            tenant=labels.tenant,
            user_id=labels.user_id,
            agent=labels.agent,
            route=labels.route,
            model=target.model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cost=cost,
        )
        return msgspec.structs.replace(response, message=message, route=plan.route.name, cost=cost)


def with_target_settings(request: ModelRequest, target: TargetConfig) -> ModelRequest:
    """The request with the target's model settings where the request sets none; of two
    output caps the smaller holds (a target's cap is often the provider's own limit)."""
    cap = request.max_output_tokens
    if target.max_output_tokens is not None:
        cap = min(cap, target.max_output_tokens) if cap else target.max_output_tokens
    return msgspec.structs.replace(
        request,
        max_output_tokens=cap,
        temperature=target.temperature if request.temperature is None else request.temperature,
        top_p=target.top_p if request.top_p is None else request.top_p,
        stop=request.stop or target.stop,
        seed=target.seed if request.seed is None else request.seed,
    )


def _repair_turn(
    request: ModelRequest, reply: ChatMessage, problems: dict[str, str]
) -> ModelRequest:
    results = [
        FunctionResultContent(
            call_id=call.call_id,
            error=REPAIR_INSTRUCTION.format(name=call.name, problem=problems[call.call_id])
            if call.call_id in problems
            else NOT_RUN_REPAIR,
        )
        for call in reply.function_calls
    ]
    now = datetime.now(UTC)
    turn = [
        msgspec.structs.replace(reply, created_at=now),
        ChatMessage(role="tool", contents=list(results), created_at=now),
    ]
    return msgspec.structs.replace(request, messages=[*request.messages, *turn])
