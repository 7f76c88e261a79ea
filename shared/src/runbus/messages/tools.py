"""Tool executor requests and replies (`runbus.tools.<name>.invoke`, `runbus.tools.list`)."""

from typing import Any, Literal

from ._base import Message, Record
from .contents import FunctionResultContent
from .model import ToolSpec

Outcome = Literal["result", "approval_required", "terminate"]
"""What the caller does with a `tools.invoked` reply:

- `result`: the call ran (or was refused); hand `result` to the model.
- `approval_required`: nothing ran; ask a human (see `approval`) and re-invoke with a grant.
- `terminate`: a policy stopped the tool loop; `result` is the terminating result, the model is
  not called again in this run.

A new value would break old callers: it comes with a new tag, never added here."""

ApprovalDecision = Literal["approved", "denied", "expired"]
"""A human's answer to an approval request; `expired` when nobody answered in time."""


class ApprovalRequest(Record, frozen=True):
    """What a human is asked to approve: one call of one tool, exactly as it will run."""

    tool: str
    """Tool the call is for."""
    arguments: dict[str, Any]
    """The model-visible arguments as they will run (after middleware changes); trusted ones
    such as `user_id` are filled in by the executor and never shown here."""
    reason: str
    """Why approval is needed, for the approver (e.g. "A$1240 is over the A$1000 limit")."""
    expires_at: float
    """Seconds since the epoch; a call not decided by then is denied as `expired`."""
    digest: str
    """Fingerprint of run, call, tool and arguments; a grant is valid only for this digest."""
    question: bool = False
    """The tool asks its owner `reason` (`runbus.interrupts`): approving with a note answers
    it (the tool is called again and reads the note), denying declines."""


class ApprovalGrant(Record, frozen=True):
    """A decision on an `ApprovalRequest`, sent back with the re-invoked call."""

    decision: ApprovalDecision
    """`approved` runs the call; `denied` and `expired` give the model a result saying why."""
    digest: str
    """The `ApprovalRequest.digest` decided on; an approval for other arguments is not valid."""
    approver: str = ""
    """User id of who decided (from their credential, never from a body); "" when expired."""
    decided_at: float = 0.0
    """Seconds since the epoch when the decision was made."""
    note: str = ""
    """Free text from the approver, shown to the model on a denial."""


class ToolInvoke(Message, frozen=True, tag="tools.invoke"):
    call_id: str
    """The model's call id, echoed in the result; with `rb-run-id` it is the call's
    idempotency key."""
    name: str
    """Tool to run; must match the subject it was sent on."""
    arguments: dict[str, Any] = {}
    """Model-chosen arguments: validated against the tool's schema before the tool runs."""
    approval: ApprovalGrant | None = None
    """A human's decision on this call, when an earlier invoke answered `approval_required`."""
    first_send: bool = False
    """The caller has not sent this call before: it is from a step the run checkpointed itself
    just now (not one a resumed run found), and not a retry. A side-effecting call is then
    claimed at once instead of looked up first (it cannot have run); the claim stays a
    compare-and-set, so one that had run anyway is still found and not run again."""


class ToolInvoked(Message, frozen=True, tag="tools.invoked"):
    result: FunctionResultContent
    """The result; a validation or tool error is a result with `error` set, not a failure.
    With `approval_required` it is an error result saying nothing ran, so a caller that does
    not know approvals still gives the model a sensible answer."""
    outcome: Outcome = "result"
    """How the caller goes on (see `Outcome`)."""
    approval: ApprovalRequest | None = None
    """Set with `approval_required`: what to ask the approver."""
    replayed: bool = False
    """The result was recorded by an earlier delivery of the same call and not run again."""
    untrusted: bool = True
    """Tool output is data from outside the trust boundary: show it to the model as data,
    never as instructions. Always true today; here so a consumer need not assume it."""


class ToolList(Message, frozen=True, tag="tools.list"):
    names: list[str] | None = None
    """Only these tools (an agent's allow-list); None lists all. Tools the run's tenant or
    agent (from `rb-prop-tenant`, `rb-agent`) may not use are left out either way."""


class ToolCatalog(Message, frozen=True, tag="tools.catalog"):
    tools: list[ToolSpec]
    """Schemas as the model sees them."""
