"""Model router request and reply (`runbus.model.complete`)."""

from typing import Annotated, Any, Literal

import msgspec

from ._base import Message, Record
from .chat import ChatMessage, Usage


class ToolSpec(Record, frozen=True):
    name: str
    """Name the model calls the tool by."""
    description: str
    """What the tool does, for the model."""
    parameters: dict[str, Any]
    """JSON Schema of the arguments the model may choose (injected ones are hidden)."""


class ModelSettings(Record, frozen=True):
    """How the model writes, as users of the OpenAI API know the settings; None (or empty) for
    the route target's default."""

    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Cap on the tokens the model may write."""
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    """Sampling temperature."""
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    """Nucleus sampling mass."""
    stop: list[str] = []
    """Sequences that end the reply."""
    seed: int | None = None
    """Sampling seed."""


class OutputFormat(Record, frozen=True):
    """The shape a final answer must have: JSON, and with `schema` JSON that validates."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "output"
    """Name of the schema, as OpenAI's `json_schema.name`."""
    schema: dict[str, Any] | None = None
    """JSON Schema of the answer; None for any JSON object (OpenAI's `json_object`)."""
    strict: bool = True
    """Ask the provider to enforce the schema while decoding, where it can."""


class ModelRequest(Message, frozen=True, tag="model.complete"):
    route: str
    """Route or model to use, e.g. `offline`, `scripted/travel-3-tools`."""
    messages: list[ChatMessage]
    """The prompt, already compacted."""
    tools: list[ToolSpec] = []
    """Tools the model may call."""
    stream_to: str | None = None
    """Subject to publish `run.text_delta` events on while the model writes."""
    message_id: str = ""
    """Id the reply's assistant message gets; its text deltas carry the same id."""
    hint: str = ""
    """A route the caller would prefer for this call (compaction asks for `cheap`); routing
    rules may act on it. Empty for none."""
    max_output_tokens: int | None = None
    """Cap on the tokens the model may write; None for the target's default (the smaller of
    the two applies when both are set)."""
    temperature: float | None = None
    """Sampling temperature; None for the target's default."""
    top_p: float | None = None
    """Nucleus sampling mass; None for the target's default."""
    stop: list[str] = []
    """Sequences that end the reply; empty for the target's default."""
    seed: int | None = None
    """Sampling seed, for repeatable replies where the provider supports it; None for the
    target's default."""
    response_format: OutputFormat | None = None
    """The shape the answer must have, asked of the provider natively (OpenAI and llama.cpp
    `response_format`); None for free text."""


FinishReason = Literal["stop", "tool_calls", "length"]


class ModelResponse(Message, frozen=True, tag="model.response"):
    message: ChatMessage
    """The assistant message (text and/or function calls)."""
    model: str
    """Model that answered."""
    finish_reason: FinishReason
    """Why the model stopped."""
    usage: Usage = Usage()
    """Tokens of this call."""
    route: str = ""
    """Route that answered, after the routing rules and capability checks."""
    cost: float = 0.0
    """Price of this call in the router's configured currency (0 without prices)."""


class ModelUsageQuery(Message, frozen=True, tag="model.usage_query"):
    day: Annotated[str, msgspec.Meta(pattern=r"^(\d{4}-\d{2}-\d{2})?\Z")] = ""
    """UTC day to report, `YYYY-MM-DD`; empty for today."""
    tenant: str = ""
    """Only this tenant; empty for every tenant."""


class UsageRow(Record, frozen=True):
    tenant: str
    """Tenant the calls were made for (`-` when the caller set none)."""
    user_id: str
    """User the calls were made for (`-` when unknown)."""
    agent: str
    """Agent that made the calls (`-` when unknown)."""
    route: str
    """Route that answered."""
    model: str
    """Model that answered."""
    calls: int = 0
    """Model calls."""
    input_tokens: int = 0
    """Tokens the model read."""
    output_tokens: int = 0
    """Tokens the model wrote."""
    cost: float = 0.0
    """Price of these calls in the report's currency."""


class TenantUsage(Record, frozen=True):
    tenant: str
    """The tenant (`-` when the caller set none)."""
    calls: int = 0
    """Model calls today."""
    input_tokens: int = 0
    """Tokens read today."""
    output_tokens: int = 0
    """Tokens written today."""
    cost: float = 0.0
    """Price of today's calls."""
    tokens_per_day: int | None = None
    """The tenant's daily token budget; None for no limit."""
    cost_per_day: float | None = None
    """The tenant's daily money budget; None for no limit."""


class ModelUsageReport(Message, frozen=True, tag="model.usage_report"):
    day: str
    """UTC day reported, `YYYY-MM-DD`."""
    currency: str = ""
    """Currency of every `cost`, as configured (e.g. `USD`)."""
    tenants: list[TenantUsage] = []
    """Totals per tenant with their budgets, by tenant."""
    rows: list[UsageRow] = []
    """Usage per tenant, user, agent, route and model."""
