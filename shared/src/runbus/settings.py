"""Process settings from `RUNBUS_*` environment variables, parsed once at start.

An unknown `RUNBUS_*` variable or a bad value stops the process at start with a message that
names the variable, instead of being ignored until it matters.
"""

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin, get_type_hints

import msgspec

ENV_PREFIX = "RUNBUS_"


class SettingsError(Exception):
    """A `RUNBUS_*` variable is unknown or has a bad value."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    nats_url: str | None = None
    """Existing NATS server to use; when unset, `runbus up` starts an embedded one."""
    nats_user: str | None = None
    """User a service or `runbus status` connects as, with `nats_password_file` (default:
    the credentials `runbus up` generated under the data dir, if any)."""
    nats_password_file: str | None = None
    """File holding the password of `nats_user` (a mounted secret)."""
    auth_issuer_seed_file: str | None = None
    """Auth service: file holding the issuer account's nkey seed (default: the one `runbus
    up` generated under the data dir)."""
    open_bus: bool = False
    """`runbus up`: an embedded NATS with no authentication at all, for hacking only (any
    local process can then act as any user); warns at every start."""
    nats_sync: Literal["always", "lazy"] = "always"
    """When every NATS runbus starts writes JetStream data to disk: before each acknowledgement
    (`always`), or lazily (`lazy`: acknowledged writes can be lost in a machine crash; warned
    at every start). Read where the server config is made (`runbus.busauth.nats_sync`)."""
    data_dir: str = ".runbus"
    """Where embedded state lives: JetStream store, embedded Qdrant, logs."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    log_format: Literal["auto", "json", "console"] = "auto"
    """`auto` is JSON unless stderr is a terminal."""
    token: str = "dev-alice"
    """Credential the CLI and client connect to NATS with and send as `rb-auth: Bearer
    <token>`."""
    tokens_file: str | None = None
    """Gateway and auth: TOML file of token → user_id, tenant (default: the packaged dev
    tokens); a change to it is picked up within about a second, without a restart."""
    client_credential_ttl: Annotated[int, msgspec.Meta(ge=1)] = 300
    """Auth: seconds the NATS user issued to a client connection lives. The server then drops
    the connection and the client reconnects through the callout, so this is the longest an
    open connection outlives the removal of its token; each client reconnects this often."""
    agents_dir: str | None = None
    """Gateway: folder of agent TOML files (default: none; `runbus up` uses the examples')."""
    run_concurrency: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 64
    """Gateway: runs one replica executes at once; it pulls no more than that."""
    tenant_run_limit: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 0
    """Gateway: runs one tenant may have running at once across all replicas (0 = no limit);
    the rest wait as `queued`."""
    tenant_run_limits: str = ""
    """Gateway: per-tenant exceptions to `tenant_run_limit`, e.g. `acme=4,globex=16`."""
    run_timeout: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    """Gateway: seconds a run may take; becomes the `rb-deadline` every hop honours."""
    run_ack_wait: Annotated[float, msgspec.Meta(ge=3, le=3600)] = 30.0
    """Gateway: seconds a run request may go unconfirmed before JetStream hands it to another
    replica, so how soon a run whose gateway died resumes elsewhere; a live gateway confirms
    each of its runs every third of it (shorter: quicker resume, more confirmations, and a
    stalled gateway's runs taken over sooner). Every replica should use the same value: the
    one that starts last sets it."""
    run_retry_window: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0
    """Gateway: seconds of backoff over which a run failing `unavailable` (NATS, JetStream or
    a service out of reach) is delivered again before it fails for good: long enough for a
    cluster to elect new leaders (about 20 s), so a node lost or a partition does not fail
    the runs it caught. The deliveries it allows (0.5 s, 1 s, 2 s, … apart) also bound how
    often a run whose gateway keeps dying is tried before it is dead-lettered."""
    request_timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Seconds one request/reply hop may take (capped by the deadline)."""
    history_max_age: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    """History: seconds a stored message is kept (0 = forever)."""
    history_max_appends: Annotated[int, msgspec.Meta(ge=0)] = 0
    """History: stored appends kept per session, oldest dropped first (0 = no limit)."""
    stream_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    """Replicas of every JetStream stream and KV bucket runbus creates (3 on a cluster)."""
    model_scripts: str | None = None
    """Model router: TOML file of scripts for the `scripted/<name>` routes of
    `runbus_examples.models`."""
    model_routes: str | None = None
    """Model router: TOML file of routes, targets and budgets (default: only the plug-in
    routes of `model_backends`)."""
    model_backends: str = ""
    """Model router: comma-separated modules whose `routes(settings)` add routes by name
    (`runbus_examples.models`: the demo's `offline` and the `scripted/<name>` routes)."""
    qdrant_url: str | None = None
    """Memory: a Qdrant server; when unset, the embedded store under the data dir is used."""
    embedder: Literal["use", "minilm", "hashing", "openai"] = "use"
    """Memory: `use` (Google's Universal Sentence Encoder, multilingual v3, offline: the
    default, it tells relevant from irrelevant in every shipped language), `minilm`
    (all-MiniLM-L6-v2 int8, offline, English only: better English recall), `hashing`
    (lexical, no model) or `openai` (an OpenAI-compatible `/embeddings` endpoint at
    `embeddings_url`). A change re-embeds the embedded store at the next start."""
    embedder_warm: bool = False
    """Memory: load the embedding model at start, in the background, so the first search does
    not wait for it (`use`: ~1 s, ~140 MiB; `minilm`: ~0.3 s, ~250 MiB with onnxruntime); the
    process is then that much larger from the start, used or not.
    `runbus up` and `runbus demo` turn it on."""
    embeddings_url: str | None = None
    """Memory: base URL of the OpenAI-compatible API of the `openai` embedder (`…/v1`)."""
    embeddings_api_key_env: str | None = None
    """Memory: environment variable holding that API's key (none: local servers need none)."""
    embeddings_model: str = "text-embedding-3-small"
    """Memory: model the `openai` embedder asks for."""
    embeddings_dimension: Annotated[int, msgspec.Meta(ge=1, le=65536)] | None = None
    """Memory: vector size the `openai` embedder requests (default: the model's own size)."""
    tool_modules: str = ""
    """Tool executor: comma-separated modules whose tools this replica serves."""
    tool_root: str | None = None
    """Tool executor: folder that path parameters of tools are confined to (default:
    `<data_dir>/files`)."""
    tool_config: str | None = None
    """Tool executor: TOML file of this deployment's middleware chain and per-tool overrides."""
    http_host: str = "127.0.0.1"
    """HTTP ingress (`runbus http`): address it listens on."""
    http_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    """HTTP ingress: port it listens on (0: any free port)."""
    jaeger_url: str = ""
    """HTTP ingress console: base URL of Jaeger's UI (each run's trace id links to
    `<url>/trace/<trace_id>`), or a URL with `{trace_id}` in it for another trace UI. Empty: the
    id is shown without a link. `/trace` in `runbus chat` prints the same link."""

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse the `RUNBUS_*` variables of `environ` (default: the process environment)."""
    environ = os.environ if environ is None else environ
    fields = set(Settings.__struct_fields__)
    values: dict[str, object] = {}
    for variable, raw in environ.items():
        if not variable.startswith(ENV_PREFIX):
            continue
        name = variable[len(ENV_PREFIX) :].lower()
        if name not in fields:
            raise SettingsError(variable, "unknown variable (typo?)")
        values[name] = raw
    try:
        return msgspec.convert(values, Settings, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec names the field as `$.field`; say which variable that is.
        text = str(exc)
        field = text.rsplit("$.", 1)[-1].rstrip("`") if "$." in text else ""
        variable = f"{ENV_PREFIX}{field.upper()}" if field else ENV_PREFIX + "*"
        raise SettingsError(variable, _problem(field, values.get(field), text)) from None


_WHOLE_FLOAT = re.compile(r"(\d)\.0\b")
_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "text"}


def _problem(field: str, raw: object, text: str) -> str:
    """msgspec's `Expected `int` >= 1, got `str` - at `$.x`` in runbus's words, with the
    value that was given."""
    said = text.split(" - at `$", 1)[0]
    given = f"{raw!r} " if raw is not None else ""
    if said.startswith("Invalid enum value"):
        choices = _choices(field)
        return f"{given}is not one of {', '.join(choices)}" if choices else f"{given}is not valid"
    if match := re.fullmatch(r"Expected `(\w+)`(?: (.+?))?(?:, got `\w+`)?", said):
        kind, bound = match.groups()
        wanted = _KINDS.get(kind, kind)
        if bound:
            whole = _WHOLE_FLOAT.sub(r"\1", bound)  # `> 0.0` reads `> 0`
            return f"{given}must be {wanted} {whole}"
        return f"{given}is not {wanted}"
    return f"{given}is not valid: {said}"


def _choices(field: str) -> tuple[str, ...]:
    """The values a `Literal` setting takes (also inside `X | None`)."""
    hint = get_type_hints(Settings).get(field)
    for candidate in (hint, *get_args(hint)):
        if get_origin(candidate) is Literal:
            return tuple(str(choice) for choice in get_args(candidate))
    return ()
