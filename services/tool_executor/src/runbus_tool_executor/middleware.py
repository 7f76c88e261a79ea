"""Function middleware: deployment code that sees every validated tool call before it runs and
decides what the model is allowed to do — proceed, change the arguments, refuse, ask a human,
or stop the tool loop."""

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from runbus.headers import RunContext

DEFAULT_APPROVAL_TTL: Final = 900.0
"""Seconds a human has to decide on an approval request unless the deployment says otherwise."""


@dataclass(frozen=True)
class Call:
    """One tool call as middleware sees it: arguments already validated, identity trusted."""

    tool: str
    """Name of the tool called."""
    call_id: str
    """The model's call id."""
    arguments: Mapping[str, Any]
    """The model-visible arguments in their JSON form (dates as ISO strings), defaults filled
    in, after any earlier middleware's `Modify`. Injected parameters are not here."""
    run: RunContext
    """The run: ids and the trusted `rb-prop-*` properties (user_id, tenant, …)."""
    side_effect: bool
    """The tool changes something outside runbus (bookings, payments, files)."""


@dataclass(frozen=True)
class Proceed:
    """Let the call go on to the next middleware and then the tool."""


@dataclass(frozen=True)
class Modify:
    """Go on with these arguments instead; they are validated against the schema again."""

    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Reject:
    """Do not run the call; the model gets this result and the tool loop goes on."""

    error: str | None = None
    """Error text the model reads (the usual case)."""
    result: Any = None
    """A JSON value to return instead of an error."""


@dataclass(frozen=True)
class RequireApproval:
    """Run the call only once a human approved it. The rest of the chain still runs first, so a
    call that another policy would refuse or stop never reaches a human."""

    reason: str
    """Why, for the approver."""
    expires_in: float | None = None
    """Seconds the approver has; None uses the deployment's default."""


@dataclass(frozen=True)
class Terminate:
    """Do not run the call and stop the tool loop: the model is not called again in this run."""

    error: str | None = None
    """Error text that ends the loop (and that the next run's model will see in history)."""
    result: Any = None
    """A JSON value to end the loop with instead of an error."""


PROCEED: Final = Proceed()

Decision = Proceed | Modify | Reject | RequireApproval | Terminate
Middleware = Callable[[Call], Decision | Awaitable[Decision]]
"""A function (sync or async) from a call to a decision; deployment code, so trusted."""


@dataclass
class Verdict:
    """What the whole chain decided for one call."""

    stop: Reject | Terminate | None = None
    """The first refusal, if any; it wins over approvals."""
    approvals: list[RequireApproval] = field(default_factory=list)
    """Every approval asked for on the way."""

    @property
    def approval_reason(self) -> str:
        return "; ".join(a.reason for a in self.approvals)

    def approval_ttl(self, default: float) -> float:
        return min((a.expires_in or default for a in self.approvals), default=default)


def approval_digest(run_id: str, call_id: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """Fingerprint binding an approval to one call with exactly these arguments."""
    canonical = msgspec.json.encode([run_id, call_id, tool, arguments], order="sorted")
    return hashlib.sha256(canonical).hexdigest()[:32]
