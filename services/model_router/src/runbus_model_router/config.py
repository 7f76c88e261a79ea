"""The routes file (`RUNBUS_MODEL_ROUTES`, TOML): backends, routes of targets, rules, budgets,
prices and the prompt audit. Parsed once at start; a typo or a dangling name fails there."""

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class RouteConfigError(Exception):
    """The routes file is unreadable or names something that does not exist."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class _Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class BackendConfig(_Config, frozen=True):
    """A provider endpoint speaking the OpenAI chat-completions protocol."""

    type: Literal["openai", "azure"] = "openai"
    """Protocol: `openai` covers OpenAI, Ollama, vLLM, llama.cpp, LM Studio and Azure's `/v1`
    endpoint; `azure` is Azure OpenAI's deployments API (key in `api-key`, `api-version` in
    the query, a target's `model` is the deployment name)."""
    base_url: str | None = None
    """Endpoint, e.g. `http://127.0.0.1:11434/v1`; None for api.openai.com. For `azure`, the
    resource, e.g. `https://my-resource.openai.azure.com`."""
    api_version: str | None = None
    """Azure OpenAI API version (`type = "azure"` only), e.g. `2024-10-21`."""
    api_key_env: str | None = None
    """Environment variable holding the API key (never the key itself in this file)."""
    family: str = "openai"
    """Provider family: reasoning is sent back only to the family that wrote it."""
    reasoning_field: str | None = None
    """Assistant-message field this family reads reasoning back from (`reasoning_content`);
    None drops reasoning from the prompt."""
    parallel_tool_calls: bool = True
    """Ask for parallel tool calls when tools are offered (some servers reject the flag)."""
    stream_usage: bool = True
    """Send `stream_options.include_usage` (older servers reject it; usage is then estimated)."""
    max_tokens_param: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"
    """Which request field carries `max_output_tokens`."""
    headers: dict[str, str] = {}
    """Extra HTTP headers on every request."""


class TargetConfig(_Config, frozen=True):
    """One model at one backend, what it accepts, how hard it may be pushed and what it costs."""

    backend: str
    """A `[backends.<name>]` entry, or built-in `offline` / `scripted/<script>`."""
    model: str = ""
    """Model name the provider knows (ignored by built-ins)."""
    text: bool = True
    """Accepts text."""
    images: bool = False
    """Accepts images (`data` image parts, image URIs)."""
    audio: bool = False
    """Accepts audio (`data` audio parts)."""
    tools: bool = True
    """Accepts tools and function calling."""
    max_context: PositiveInt | None = None
    """Context window in tokens (prompt estimate + max output); None for no check."""
    concurrency: PositiveInt | None = None
    """Requests in flight at once, per router replica; the rest wait their turn."""
    requests_per_minute: PositiveFloat | None = None
    """Token-bucket rate of requests, per replica."""
    tokens_per_minute: PositiveFloat | None = None
    """Token-bucket rate of estimated prompt tokens, per replica."""
    burst: PositiveInt | None = None
    """Bucket size for `requests_per_minute` (default: one second's worth, at least 1)."""
    timeout: PositiveFloat = 60.0
    """Seconds the provider may stay silent (before the reply starts or between chunks)."""
    retries: NonNegativeInt = 1
    """Extra attempts on this target after a timeout, 429, 5xx or connection error."""
    backoff: NonNegativeFloat = 0.25
    """First retry waits this long, doubling each time (when no `Retry-After` is given)."""
    max_backoff: NonNegativeFloat = 8.0
    """Longest wait between attempts."""
    max_retry_after: NonNegativeFloat = 30.0
    """A `Retry-After` longer than this moves on to the next target instead of waiting."""
    breaker_failures: PositiveInt = 5
    """Consecutive failures that open this target's circuit."""
    breaker_cooldown: PositiveFloat = 30.0
    """Seconds an open circuit stays open before one probe call is let through."""
    max_output_tokens: PositiveInt | None = None
    """Cap on the tokens this target writes; a request's own cap applies when smaller."""
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    """Sampling temperature when the request sets none."""
    top_p: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None
    """Nucleus sampling mass when the request sets none."""
    stop: list[str] = []
    """Stop sequences when the request sets none."""
    seed: int | None = None
    """Sampling seed when the request sets none."""
    native_tools: bool = True
    """The model calls tools through the API's `tools` field. False: tools are offered through
    structured output (a JSON schema in `response_format`, which llama.cpp, vLLM and Ollama
    enforce) and the answer is turned into ordinary function calls."""
    native_output: bool = True
    """The API takes an output format in `response_format` (json_schema). False: it is offered
    as a `final_result` tool whose arguments are the answer, turned back into the answer's
    text."""
    input_price: NonNegativeFloat = 0.0
    """Price per million input tokens."""
    output_price: NonNegativeFloat = 0.0
    """Price per million output tokens."""


class RouteConfig(_Config, frozen=True):
    targets: list[TargetConfig]
    """In order of preference: the first that is capable, closed and answers wins."""
    reroute: list[str] = []
    """Routes to try, in order, when no target here can take the request (e.g. `vision`)."""
    unsupported: Literal["reject", "placeholder"] = "reject"
    """With no capable target anywhere: refuse (`unsupported_request`) or replace the images
    and audio the target cannot take with a text placeholder naming them."""
    repair_attempts: NonNegativeInt = 1
    """Times the model is shown its own unreadable tool-call arguments and asked again."""


class RuleConfig(_Config, frozen=True):
    """Send a call to route `use` when every condition given here holds; first match wins."""

    use: str
    """Route to use."""
    route: str | None = None
    """The request's route (the agent's default) is this."""
    hint: str | None = None
    """The request's hint is this."""
    agent: str | None = None
    """The calling agent is this."""
    props: dict[str, str] = {}
    """Trusted run properties (`rb-prop-*`) have these values, e.g. `{tier = "gold"}`."""
    has_images: bool | None = None
    """The prompt does (or does not) contain images."""
    has_audio: bool | None = None
    """The prompt does (or does not) contain audio."""
    needs_tools: bool | None = None
    """Tools are (or are not) offered."""
    min_tokens: NonNegativeInt | None = None
    """The prompt is estimated at this many tokens or more."""


class BudgetConfig(_Config, frozen=True):
    tokens_per_day: NonNegativeInt | None = None
    """Input + output tokens per UTC day; None for no limit."""
    cost_per_day: NonNegativeFloat | None = None
    """Money per UTC day in `currency`; None for no limit."""


class AuditConfig(_Config, frozen=True):
    enabled: bool = False
    """Log every prompt exactly as sent to a target (event `model_prompt_sent`)."""
    redact: list[str] = []
    """Extra regular expressions whose matches are replaced before logging."""


class RouterConfig(_Config, frozen=True):
    currency: str = "USD"
    """Currency of prices and money budgets."""
    usage_flush_seconds: PositiveFloat = 1.0
    """How often a replica adds its usage to the shared counters."""
    backends: dict[str, BackendConfig] = {}
    routes: dict[str, RouteConfig] = {}
    rules: list[RuleConfig] = []
    budgets: dict[str, BudgetConfig] = {}
    """Per tenant; `"*"` applies to every tenant not listed."""
    audit: AuditConfig = AuditConfig()

    def budget_for(self, tenant: str) -> BudgetConfig | None:
        return self.budgets.get(tenant) or self.budgets.get("*")


def is_builtin(backend: str) -> bool:
    return backend == "offline" or backend.startswith("scripted/")


def load_config(path: Path) -> RouterConfig:
    """Parse and check a routes file; every problem names the file and the entry."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise RouteConfigError(str(path), str(exc)) from None
    return parse_config(text, str(path))


def parse_config(text: str, where: str = "routes") -> RouterConfig:
    try:
        config = msgspec.convert(tomllib.loads(text), RouterConfig)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise RouteConfigError(where, str(exc)) from None
    check_config(config, where)
    return config


def check_config(config: RouterConfig, where: str = "routes") -> None:
    """Names that must exist do; regular expressions compile."""
    routes = set(config.routes)
    for name, route in config.routes.items():
        if not route.targets:
            raise RouteConfigError(where, f"route {name!r} has no targets")
        for target in route.targets:
            if not is_builtin(target.backend) and target.backend not in config.backends:
                raise RouteConfigError(where, f"route {name!r}: unknown backend {target.backend!r}")
            if not is_builtin(target.backend) and not target.model:
                raise RouteConfigError(where, f"route {name!r}: a target needs a model")
        for other in route.reroute:
            if other not in routes and not is_builtin(other):
                raise RouteConfigError(where, f"route {name!r}: reroute to unknown {other!r}")
    for name, backend in config.backends.items():
        if backend.type == "azure" and not (backend.base_url and backend.api_version):
            raise RouteConfigError(where, f"backend {name!r}: azure needs base_url and api_version")
    for index, rule in enumerate(config.rules):
        if rule.use not in routes and not is_builtin(rule.use):
            raise RouteConfigError(where, f"rule {index + 1}: uses unknown route {rule.use!r}")
    for pattern in config.audit.redact:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise RouteConfigError(where, f"audit.redact {pattern!r}: {exc}") from None
