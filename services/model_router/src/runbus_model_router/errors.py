"""Errors of the model router: what a caller gets back, and what backends raise to the router.

Backends raise `ProviderFailure` subclasses; the router decides from the class whether to retry,
fall back to the next target or give up, so it never needs to know a provider's SDK.
"""

from typing import Any

from runbus.errors import BadRequest, ModelError, RunbusError
from runbus.messages import ChatMessage, Usage


class UnknownRoute(BadRequest):
    code = "unknown_route"

    def __init__(self, route: str, known: list[str]) -> None:
        super().__init__(
            f"no model route {route!r}; known: {', '.join(known) or 'none'}",
            details={"route": route, "known": known},
        )
        self.route = route


class InvalidToolSchema(BadRequest):
    """A tool offered to the model has a name or parameter schema no provider would accept."""

    code = "invalid_tool_schema"

    def __init__(self, tool: str, problem: str) -> None:
        super().__init__(f"tool {tool!r}: {problem}", details={"tool": tool, "problem": problem})
        self.tool = tool
        self.problem = problem


class UnsupportedRequest(BadRequest):
    """No target of the route (or of the routes it may re-route to) can take the request."""

    code = "unsupported_request"

    def __init__(self, route: str, needs: list[str]) -> None:
        super().__init__(
            f"no target of route {route!r} can take this request (needs {', '.join(needs)})",
            details={"route": route, "needs": needs},
        )
        self.route = route
        self.needs = needs


class BudgetExceeded(RunbusError):
    """The tenant's daily budget is spent; checked before any provider is asked."""

    code = "budget_exceeded"

    def __init__(self, tenant: str, unit: str, spent: float, limit: float, needed: float) -> None:
        super().__init__(
            f"tenant {tenant!r} has used {spent:g} of its daily {unit} budget of {limit:g}; "
            f"this call needs about {needed:g} more",
            details={
                "tenant": tenant,
                "unit": unit,
                "spent": spent,
                "limit": limit,
                "needed": needed,
            },
        )
        self.tenant = tenant
        self.unit = unit
        self.spent = spent
        self.limit = limit
        self.needed = needed


class ModelUnavailable(RunbusError):
    """Every target of the route failed, timed out or has its circuit open."""

    code = "model_unavailable"

    def __init__(self, route: str, attempts: list[str]) -> None:
        super().__init__(
            f"no target of route {route!r} answered: {'; '.join(attempts) or 'none tried'}",
            details={"route": route, "attempts": attempts},
        )
        self.route = route
        self.attempts = attempts


class RunCancelled(RunbusError):
    """The run was cancelled while its model call was in flight; the stream was stopped."""

    code = "cancelled"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was cancelled", details={"run_id": run_id})
        self.run_id = run_id


class ScriptExhausted(ModelError):
    def __init__(self, script: str, index: int) -> None:
        super().__init__(f"script {script!r} has no reply number {index + 1}")
        self.script = script
        self.index = index


class InvalidToolArguments(ModelError):
    """The model kept writing tool-call arguments that are not a JSON object."""

    code = "invalid_tool_arguments"

    def __init__(self, problems: list[str]) -> None:
        super().__init__(
            f"the model's tool-call arguments are not valid JSON: {'; '.join(problems)}",
            details={"problems": problems},
        )
        self.problems = problems


class StreamBroken(ModelError):
    """The provider failed after text had already been streamed, so no fallback is possible."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"{target} failed mid-stream: {reason}", details={"target": target})
        self.target = target
        self.reason = reason


class ProviderFailure(ModelError):
    """Raised by a backend: the provider did not give a usable answer."""

    def __init__(self, reason: str, *, status: int | None = None, **details: Any) -> None:
        super().__init__(reason, details={"status": status, **details} if status else details)
        self.reason = reason
        self.status = status


class ProviderUnavailable(ProviderFailure):
    """Worth retrying after a while: timeout, connection error, 429, 5xx."""

    def __init__(
        self, reason: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(reason, status=status)
        self.retry_after = retry_after
        """Seconds the provider asked us to wait (`Retry-After`), if it said."""


class TargetMisconfigured(ProviderFailure):
    """Not worth retrying on this target, but another may work: 401, 403, 404."""


class ProviderRejected(ProviderFailure):
    """The provider refused the request itself (400, 422): no other target will do better."""


class ContextTooLong(ProviderRejected):
    """The provider refused the prompt as longer than the model's context window. Its message
    is written for the run's owner: the prompt only shrinks by what the agent sends, so it says
    how (another target of the route, with a larger context, may still take it)."""

    code = "context_too_long"

    def __init__(
        self,
        model: str,
        *,
        prompt_tokens: int | None = None,
        context_tokens: int | None = None,
        status: int | None = None,
        provider: str = "",
    ) -> None:
        sizes = ""
        if prompt_tokens and context_tokens:
            sizes = f" ({prompt_tokens} tokens; it holds {context_tokens})"
        elif context_tokens:
            sizes = f" (it holds {context_tokens} tokens)"
        elif prompt_tokens:
            sizes = f" ({prompt_tokens} tokens)"
        super().__init__(
            f"the prompt is too long for model {model!r}{sizes}. Send less: give the agent a "
            "compaction policy (its [compaction] table, e.g. strategy context_window), load a "
            "shorter history (last_turns), or route it to a model with a larger context",
            status=status,
            model=model,
            prompt_tokens=prompt_tokens,
            context_tokens=context_tokens,
        )
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens
        self.provider = provider
        """The provider's own words, for the log (never shown to the run's owner)."""


class BadToolArguments(ModelError):
    """Raised by a backend: the reply's tool calls carry arguments that are not a JSON object.

    `reply` is the assistant message with those calls' arguments emptied, so the router can
    show the model its own call next to the error and ask again.
    """

    def __init__(self, message: ChatMessage, problems: dict[str, str], usage: Usage) -> None:
        super().__init__(f"{len(problems)} tool call(s) with unreadable arguments")
        self.reply = message
        self.problems = problems
        """call_id → what was wrong (the parse error and the raw text)."""
        self.usage = usage
