"""Agent definitions: TOML files decoded into frozen Structs at start."""

import functools
import tomllib
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import jsonschema
import msgspec
from jsonschema.exceptions import SchemaError

from runbus.errors import BadRequest
from runbus.messages import Identifier, ModelSettings, OutputFormat
from runbus.messages.compaction import (
    CompactionStrategy,
    NoCompaction,
    Tokenizer,
    strategy_from_config,
)
from runbus.messages.memory import SearchScope
from runbus.messages.sessions import ConcurrencyPolicy

from .errors import GatewayConfigError
from .harness.config import HarnessConfig, Table
from .harness.guardrails import Guardrail, build_guardrails
from .harness.runtime import Harness
from .type_paths import load_type


class MemoryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    enabled: bool = False
    """Use long-term memory at all."""
    retrieval: Literal["before_invoke", "on_demand"] = "before_invoke"
    """`before_invoke`: search with the user's text before the first model call and give the
    hits to the model as one context message; `on_demand`: offer the model a `memory_search`
    tool (its scope is fixed here, never by the model)."""
    search_scope: SearchScope | list[str] = "user"
    """Where searches look: a preset, or the storage-scope fields a memory must share
    (`["user_id", "agent_id"]`); `[]` searches nothing. Storage always uses the full scope."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=50)] = 5
    """Memories given to the model at most."""
    min_score: Annotated[float, msgspec.Meta(ge=-1, le=1)] | None = None
    """Leave out hits scoring below this; None: the memory service's relevance threshold for
    its embedder (chosen on the labelled evaluation set); -1 keeps every hit."""
    store_user_statements: bool = False
    """At the end of each run, store what the user stated about themselves (facts, preferences,
    constraints; never requests, questions, instructions or claims of authority)."""
    store: Literal["rules", "model"] = "rules"
    """How what to store is decided: `rules`, deterministic and offline (`runbus.memory_rules`,
    six languages); `model`, the memory service asks `store_route` to extract the user's facts
    in any language, checks them against the same rules and reconciles them with the user's
    memories (add, update, delete, nothing)."""
    store_route: str = ""
    """Model route of the `model` policy's extraction call (required with it)."""

    def __post_init__(self) -> None:
        if self.store == "model" and not self.store_route.strip():
            raise ValueError('memory store = "model" needs store_route: the route that extracts')

    @property
    def searches_before_invoke(self) -> bool:
        return self.enabled and self.retrieval == "before_invoke"

    @property
    def offers_tool(self) -> bool:
        return self.enabled and self.retrieval == "on_demand"

    def search_props(self) -> dict[str, str]:
        """The trusted run properties that fix what the `memory_search` tool may see."""
        scope = self.search_scope
        props = {
            "memory_scope": scope if isinstance(scope, str) else ",".join(scope),
            "memory_limit": str(self.limit),
        }
        if self.min_score is not None:
            props["memory_min_score"] = str(self.min_score)
        return props

    def store_props(self) -> dict[str, str]:
        """The trusted run properties that tell the memory service how to store a run's write."""
        if self.store == "rules":
            return {}
        return {"memory_store": self.store, "memory_store_route": self.store_route.strip()}


class CompactionPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An agent's `[compaction]` table: the strategy's own keys (`strategy = "pipeline"`, its
    `steps`, triggers, …) plus the few below, which the gateway reads itself."""

    strategy: CompactionStrategy = NoCompaction()
    """How the prompt copy is shrunk before each model call (see docs/services/compaction.md)."""
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Legacy budget: with no strategy, collapse tool results then truncate above this."""
    tokenizer: Tokenizer = "bytes"
    """How compaction counts tokens."""
    persist: bool = False
    """Also compact what history stores: later runs load the compacted history (bounded)
    instead of every message; the originals stay stored for audit and export."""

    @property
    def enabled(self) -> bool:
        """False when nothing would ever be compacted: the gateway then skips the hop."""
        return self.max_tokens is not None or not isinstance(self.strategy, NoCompaction)

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> "CompactionPolicy":
        own = {k: table[k] for k in OWN_COMPACTION_KEYS if k in table}
        strategy = (
            strategy_from_config(table, ignore=OWN_COMPACTION_KEYS)
            if "strategy" in table
            else NoCompaction()
        )
        if "strategy" not in table and set(table) - set(OWN_COMPACTION_KEYS):
            unknown = sorted(set(table) - set(OWN_COMPACTION_KEYS))
            raise msgspec.ValidationError(f"unknown keys {unknown} - at `$.compaction`")
        return msgspec.convert({**own, "strategy": msgspec.to_builtins(strategy)}, cls)


OWN_COMPACTION_KEYS = ("max_tokens", "tokenizer", "persist")
MODEL_SETTINGS: Final = tuple(f.name for f in msgspec.structs.fields(ModelSettings))


class OutputPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An agent's `[output]` table: the shape of its answer and the guardrails the answer must
    pass before anything of it is shown (see docs/features/structured-output.md and
    output-guardrails.md)."""

    schema: dict[str, Any] | None = None
    """JSON Schema of the answer, inline (a TOML table)."""
    schema_file: str | None = None
    """A JSON Schema file, relative to the agent file."""
    type: str | None = None
    """`module:Type` of a msgspec Struct (or any type msgspec has a schema for)."""
    json: bool = False
    """Any JSON object (OpenAI's `json_object`), when no schema is named."""
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "output"
    """Name of the schema, as the provider is told it."""
    strict: bool = True
    """Ask the provider to enforce the schema while decoding."""
    guardrails: list[Table] = []
    """Output guardrails (the input guardrails' kinds: `{name = "blocked_terms", …}`), run on
    every text the model writes before it is shown; the first that trips fails the run as
    `output_blocked`. With any, the model's text is held until it passes."""

    def __post_init__(self) -> None:
        named = [k for k in ("schema", "schema_file", "type") if getattr(self, k) is not None]
        if len(named) > 1:
            raise ValueError(f"name one of schema, schema_file and type, not {named}")

    def format(self, folder: Path | None) -> OutputFormat | None:
        """The output format this table asks for, its schema read and checked;
        `GatewayConfigError` says what is wrong."""
        schema = self.schema
        if self.schema_file is not None:
            path = (folder or Path()) / self.schema_file
            try:
                schema = msgspec.json.decode(path.read_bytes())
            except (OSError, msgspec.DecodeError) as exc:
                raise GatewayConfigError(f"schema_file {str(path)!r}: {exc}") from None
        elif self.type is not None:
            schema = msgspec.json.schema(_load_type(self.type))
        if schema is None:
            return OutputFormat(name=self.name, strict=self.strict) if self.json else None
        if not isinstance(schema, dict) or (problem := schema_problem(schema)) is not None:
            problem = "not an object" if not isinstance(schema, dict) else problem
            raise GatewayConfigError(f"output schema is not a JSON Schema: {problem}")
        return OutputFormat(name=self.name, schema=schema, strict=self.strict)


def schema_problem(schema: dict[str, Any]) -> str | None:
    """What is wrong with `schema` as a JSON Schema, or None."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return str(exc.message)
    return None


def _load_type(path: str) -> type:
    found = load_type(path, "output type")
    try:
        msgspec.json.schema(found)
    except TypeError as exc:
        raise GatewayConfigError(f"output type {path!r} has no JSON Schema: {exc}") from None
    return found


class AgentTool(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An `[[agent_tools]]` entry: another agent of this gateway offered to the model as a
    tool; each call is a child run of it on the bus (docs/multi-agent.md)."""

    agent: Identifier
    """The agent called."""
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = ""
    """The tool's name, as the model calls it ("": the agent's name)."""
    description: str = ""
    """What the model reads about when to call it."""

    @property
    def tool_name(self) -> str:
        return self.name or self.agent


class RemoteAgent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A `[[remote_agents]]` entry: an A2A agent elsewhere, offered to the model as a tool."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    """The tool's name, as the model calls it."""
    url: str
    """The agent's A2A endpoint (JSON-RPC), e.g. `https://agents.example.com/a2a/flights`."""
    description: str = ""
    """What the model reads about when to call it ("": the agent card's description)."""
    token_env: str = ""
    """Environment variable holding the bearer token sent to it (a secret)."""
    token_file: str = ""
    """A file holding that token instead (a mounted secret), read at each call."""
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    """Seconds one call may take at most (the run's deadline may cut it shorter)."""


class AgentSpec(
    msgspec.Struct,
    frozen=True,
    forbid_unknown_fields=True,
    dict=True,  # room for the harness built from it (functools.cached_property)
):
    name: Identifier
    """Name runs address the agent by (`runbus.runs.<name>`)."""
    instructions: str = ""
    """System prompt."""
    model: str = ""
    """Model route, e.g. `offline` or `scripted/<script>` (not used by program agents)."""
    model_settings: ModelSettings = ModelSettings()
    """`[model_settings]`: max_output_tokens, temperature, top_p, stop, seed for every call
    (unset ones take the route target's defaults)."""
    description: str = ""
    tools: list[str] = []
    """Tools the model may call; anything else it asks for is refused."""
    client_tools: bool = False
    """Whether a run may bring the caller's own tools (OpenAI `tools`, AG-UI frontend tools):
    the model may call them, and the run waits for the caller's answer. Off: a request with
    any is refused (`unsupported_request`), never run as if they were not there."""
    max_iterations: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 40
    """Model calls per run at most."""
    max_consecutive_tool_errors: Annotated[int, msgspec.Meta(ge=1)] = 5
    """Steps in a row whose tool calls all failed before the run gives up."""
    max_tool_calls: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 64
    """Tool calls one model reply may ask for; a reply with more fails the run with
    `tool_call_limit` before any of them runs or is stored."""
    concurrency: ConcurrencyPolicy = "reject"
    """A second run on a busy session: `reject`, `enqueue` (wait) or `interrupt` (cancel the
    first)."""
    memory: MemoryPolicy = MemoryPolicy()
    compaction: CompactionPolicy = CompactionPolicy()
    harness: HarnessConfig = HarnessConfig()
    """Guardrails, todo list, modes, loop mode, or a program instead of a model."""
    output: OutputPolicy = OutputPolicy()
    """`[output]`: the answer's shape and the output guardrails."""
    output_format: OutputFormat | None = None
    """The answer's shape as the model is asked for it (from `output`, set when the agent
    file is loaded, or a request's own)."""
    agent_tools: list[AgentTool] = []
    """`[[agent_tools]]`: other agents the model may call as tools, each call a child run."""
    remote_agents: list[RemoteAgent] = []
    """`[[remote_agents]]`: A2A agents elsewhere the model may call as tools."""
    handoffs: list[Identifier] = []
    """Agents this one may hand the conversation to (the session's next runs go to them)."""
    handoff_holds: Literal["session", "run"] = "session"
    """Handed the conversation, this agent keeps it (`session`: until it hands it on) or
    answers one run and gives it back to the agent the client addresses (`run`)."""

    def __post_init__(self) -> None:
        if self.harness.kind == "chat" and not self.model:
            raise ValueError("`model` is required unless harness kind is 'program'")

    @functools.cached_property
    def runtime(self) -> Harness:
        """The harness built from `harness`, once per agent: its plug-ins, its program, and a
        check that the agent lists none of its own tools. `GatewayConfigError` says what is
        wrong."""
        harness = Harness.from_config(self.harness)
        harness.check_tool_names(self.tools)
        return harness

    @functools.cached_property
    def output_guardrails(self) -> list[Guardrail]:
        return build_guardrails(self.output.guardrails)

    @property
    def holds_text(self) -> bool:
        """The model's text is shown only once the answer is checked: it has output
        guardrails, or an output format (an invalid answer is never shown)."""
        return bool(self.output.guardrails) or self.output_format is not None

    def for_run(self, output_format: OutputFormat | None) -> "AgentSpec":
        """The agent for a run that asks for its own output format (None: as it is);
        `BadRequest` for a schema that is no JSON Schema."""
        if output_format is None or output_format == self.output_format:
            return self
        schema = output_format.schema
        if schema is not None and (problem := schema_problem(schema)) is not None:
            raise BadRequest(
                f"the run's output_format schema is not a JSON Schema: {problem}",
                details={"field": "output_format"},
            )
        agent = msgspec.structs.replace(self, output_format=output_format)
        # The harness and guardrails are the same: built once per agent, not per run.
        agent.__dict__.update(runtime=self.runtime, output_guardrails=self.output_guardrails)
        return agent


def load_agents(folder: Path | None = None) -> dict[str, AgentSpec]:
    """Every `*.toml` in `folder` (`RUNBUS_AGENTS_DIR`), by name; none without a folder."""
    files = sorted(folder.glob("*.toml")) if folder is not None else []
    agents: dict[str, AgentSpec] = {}
    for file in files:
        try:
            table = tomllib.loads(file.read_text())
            _check_model_settings(file, table.get("model_settings"))
            if "output_format" in table:
                raise GatewayConfigError(
                    f"agent file {str(file)!r}: unknown key 'output_format'; the answer's shape "
                    "is declared in the [output] table"
                )
            compaction = CompactionPolicy.from_table(table.pop("compaction", {}))
            agent = msgspec.convert(table, AgentSpec)
            agent = msgspec.structs.replace(agent, compaction=compaction)
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise GatewayConfigError(f"agent file {str(file)!r}: {exc}") from None
        try:
            # The table is well-formed; whether its plug-ins and program exist is the
            # harness's to say (built here, once, for every run of the agent).
            agent.runtime  # noqa: B018
        except GatewayConfigError as exc:
            raise GatewayConfigError(f"agent file {str(file)!r}: {exc} - at `$.harness`") from None
        try:
            agent.output_guardrails  # noqa: B018
            agent = msgspec.structs.replace(agent, output_format=agent.output.format(file.parent))
        except GatewayConfigError as exc:
            raise GatewayConfigError(f"agent file {str(file)!r}: {exc} - at `$.output`") from None
        if agent.name in agents:
            raise GatewayConfigError(f"agent {agent.name!r} is defined twice")
        agents[agent.name] = agent
    _check_called_agents(agents)
    return agents


def _check_called_agents(agents: dict[str, AgentSpec]) -> None:
    """An agent that calls or hands off to an agent nobody defined is refused at start."""
    for agent in agents.values():
        for called in [t.agent for t in agent.agent_tools] + agent.handoffs:
            if called not in agents:
                raise GatewayConfigError(
                    f"agent {agent.name!r} names agent {called!r}, which is not defined"
                )


def _check_model_settings(file: Path, table: object) -> None:
    """A misspelt setting would silently take the target's default: refused,
    naming the valid ones."""
    if not isinstance(table, dict):
        return
    unknown = sorted(set(table) - set(MODEL_SETTINGS))
    if unknown:
        raise GatewayConfigError(
            f"agent file {str(file)!r}: unknown model setting {', '.join(map(repr, unknown))} "
            f"in [model_settings]; the valid ones are {', '.join(MODEL_SETTINGS)}"
        )
