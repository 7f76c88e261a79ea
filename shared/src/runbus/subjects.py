"""Every NATS subject, stream and queue-group name runbus uses, and the span-name templates.

No subject string literal lives anywhere else: services and clients build subjects here.
"""

from typing import Final

PREFIX: Final = "runbus"

# Runs: a JetStream work queue, one subject per agent.
RUNS_STREAM: Final = "RUNBUS_RUNS"
RUNS_ALL: Final = f"{PREFIX}.runs.>"
RUNS_TEMPLATE: Final = f"{PREFIX}.runs.{{agent}}"
RUNS_CONSUMER: Final = "gateway"

# Runs that kept failing, with their error; and what the gateway knows of each run.
DEAD_STREAM: Final = "RUNBUS_DEAD"
DEAD_ALL: Final = f"{PREFIX}.dead.>"
RUN_STATE_BUCKET: Final = "RUNBUS_RUN_STATE"
APPROVALS_BUCKET: Final = "RUNBUS_APPROVALS"
BLOBS_BUCKET: Final = "RUNBUS_BLOBS"
"""Object store of large content parts, referenced as `runbus-blob://<sha256>`."""

# Run events: plain publishes captured by a JetStream stream for late readers. The subject
# names the run's owner, so NATS permissions can give each user their own events only.
EVENTS_STREAM: Final = "RUNBUS_EVENTS"
EVENTS_ALL: Final = f"{PREFIX}.events.>"
EVENTS_TEMPLATE: Final = f"{PREFIX}.events.{{tenant}}.{{user_id}}.{{run_id}}"

# Run control: a cancel of one owner's run is published here; whoever works for it listens.
CANCEL_ALL: Final = f"{PREFIX}.cancel.>"
CANCEL_TEMPLATE: Final = f"{PREFIX}.cancel.{{tenant}}.{{user_id}}.{{run_id}}"

# Request/reply endpoints.
HISTORY_APPEND: Final = f"{PREFIX}.history.append"
HISTORY_LOAD: Final = f"{PREFIX}.history.load"
SESSIONS_OPEN: Final = f"{PREFIX}.sessions.open"
SESSIONS_GET: Final = f"{PREFIX}.sessions.get"
SESSIONS_LIST: Final = f"{PREFIX}.sessions.list"
SESSIONS_STATE_UPDATE: Final = f"{PREFIX}.sessions.state.update"
SESSIONS_EXPORT: Final = f"{PREFIX}.sessions.export"
SESSIONS_IMPORT: Final = f"{PREFIX}.sessions.import"
SESSIONS_DELETE: Final = f"{PREFIX}.sessions.delete"
MEMORY_STORE: Final = f"{PREFIX}.memory.store"
MEMORY_SEARCH: Final = f"{PREFIX}.memory.search"
MEMORY_FIND: Final = f"{PREFIX}.memory.find"
MEMORY_LIST: Final = f"{PREFIX}.memory.list"
MEMORY_FORGET: Final = f"{PREFIX}.memory.forget"
MEMORY_STATS: Final = f"{PREFIX}.memory.stats"
COMPACTION_COMPACT: Final = f"{PREFIX}.compaction.compact"
MODEL_COMPLETE: Final = f"{PREFIX}.model.complete"
MODEL_USAGE: Final = f"{PREFIX}.model.usage"
TOOLS_LIST: Final = f"{PREFIX}.tools.list"
TOOL_INVOKE_TEMPLATE: Final = f"{PREFIX}.tools.{{name}}.invoke"

# Model router state its replicas share: daily usage counters, reasoning provenance.
MODEL_BUCKET: Final = "RUNBUS_MODEL"

# Tool executor state: call records (idempotency keys) and the catalog all deployments share.
TOOL_CALLS_BUCKET: Final = "RUNBUS_TOOL_CALLS"
TOOL_CATALOG_BUCKET: Final = "RUNBUS_TOOL_CATALOG"

# Memory writes off the run's path: a JetStream work queue of `memory.store` bodies with the
# run's headers, consumed by the memory replicas through one durable pull consumer.
MEMORY_WRITES_STREAM: Final = "RUNBUS_MEMORY_WRITES"
MEMORY_WRITES: Final = f"{PREFIX}.memory.writes"
MEMORY_WRITES_CONSUMER: Final = "memory"

# History storage: one subject per tenant and session inside one stream; records in KV.
HISTORY_STREAM: Final = "RUNBUS_HISTORY"
HISTORY_LOG_ALL: Final = f"{PREFIX}.hist.>"
HISTORY_LOG_TEMPLATE: Final = f"{PREFIX}.hist.{{tenant}}.{{session_id}}"
HISTORY_COMPACTIONS_TEMPLATE: Final = f"{HISTORY_LOG_TEMPLATE}.compactions"
SESSIONS_BUCKET: Final = "RUNBUS_SESSIONS"

# Start-up progress of every service process (`runbus up`, `runbus status` listen).
PROGRESS_ALL: Final = f"{PREFIX}.progress.>"


def progress(service: str) -> str:
    """Subject a process of `service` reports its start-up progress on."""
    return f"{PREFIX}.progress.{service}"


# The client API: authenticated requests the gateway checks and forwards to `runbus.<op>`.
API_ALL: Final = f"{PREFIX}.api.>"
API_TEMPLATE: Final = f"{PREFIX}.api.{{op}}"


def api(op: str) -> str:
    """Subject a client sends the authenticated operation `op` (e.g. `sessions.list`) to."""
    return f"{PREFIX}.api.{op}"


def internal(op: str) -> str:
    """The service subject an API operation is forwarded to."""
    return f"{PREFIX}.{op}"


def runs(agent: str) -> str:
    """Subject a run request for `agent` is published on."""
    return f"{PREFIX}.runs.{agent}"


def dead(agent: str) -> str:
    """Subject a run request that kept failing is moved to."""
    return f"{PREFIX}.dead.{agent}"


UNOWNED: Final = "~"
"""Owner token of a run request whose owner is unknown (its token failed): no principal can
have it (it is no identifier), so no client reads that run's `run.failed`."""


def events(tenant: str, user_id: str, run_id: str) -> str:
    """Subject the events of `run_id`, owned by `user_id` of `tenant`, are published on."""
    return f"{PREFIX}.events.{tenant or UNOWNED}.{user_id or UNOWNED}.{run_id}"


def owner_events(tenant: str, user_id: str) -> str:
    """Every event subject of one owner's runs (what that user may read)."""
    return f"{PREFIX}.events.{tenant}.{user_id}.>"


def run_cancel(tenant: str, user_id: str, run_id: str) -> str:
    """Subject a cancel of the owner's `run_id` is published on (the gateway holding the run,
    model streams and tools stop on it). The run id is always the last token."""
    return f"{PREFIX}.cancel.{tenant}.{user_id}.{run_id}"


def parse_run_cancel(subject: str) -> tuple[str, str, str] | None:
    """(tenant, user_id, run_id) of a `run_cancel` subject, or None if it is not one."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:2]) != f"{PREFIX}.cancel":
        return None
    return parts[2], parts[3], parts[4]


def tool_invoke(name: str) -> str:
    """Subject the tool `name` answers on."""
    return f"{PREFIX}.tools.{name}.invoke"


def session_key(tenant: str, session_id: str) -> str:
    """Key of a session record in the sessions bucket."""
    return f"{tenant}.{session_id}"


def history_log(tenant: str, session_id: str) -> str:
    """Storage subject of one session's messages: written by the history service and by the
    gateway for the session its run holds; read only by the history service."""
    return f"{PREFIX}.hist.{tenant}.{session_id}"


def history_compactions(tenant: str, session_id: str) -> str:
    """Storage subject of one session's persisted compactions, in the history stream next to
    its messages: written by the history service and by the gateway for the session its run
    holds; read only by the history service."""
    return f"{PREFIX}.hist.{tenant}.{session_id}.compactions"


# Connection identities. Services and the auth callout use credentials of their own (they
# bypass the callout); a client connects with its bearer token, which the callout turns into
# a NATS user allowed only that user's subjects.
AUTH_CALLOUT: Final = "$SYS.REQ.USER.AUTH"
"""Where nats-server asks the auth service about each client connection."""
AUTH_WHOAMI: Final = f"{PREFIX}.auth.whoami"
"""Where a client learns which tenant and user its token stands for."""
SERVICE_INBOX_PREFIX: Final = "_RBSVC"
"""Reply subjects of service connections: no client may subscribe under it."""
CLIENT_INBOX_ROOT: Final = "_INBOX"


def client_inbox_prefix(token_digest: str) -> str:
    """Inbox prefix of a client connection: its replies and consumer deliveries land under
    it, and only that credential's connections may subscribe there."""
    return f"{CLIENT_INBOX_ROOT}.{token_digest}"


CLIENT_JS_API: Final = "JS.RUNBUS.API"
"""JetStream API prefix of client connections: their account imports only the consumer
creation of the events stream from the services' account, under this prefix."""


def consumer_create(stream: str, filter_subject: str, api: str = "$JS.API") -> str:
    """The JetStream API subject that creates a named consumer of `stream` with one filter
    (any name): the form a permission can pin to a filter."""
    return f"{api}.CONSUMER.CREATE.{stream}.*.{filter_subject}"


CONSUMER_CHECKS: Final = consumer_create(EVENTS_STREAM, ">", f"{PREFIX}.auth.js")
"""Where the auth service takes a client's creation of a consumer of the events stream (the
clients' account imports it as JetStream's API under `CLIENT_JS_API`): it forwards to
JetStream only a consumer that delivers into an inbox of the filter's own user."""
