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

# Run events: plain publishes captured by a JetStream stream for late readers.
EVENTS_STREAM: Final = "RUNBUS_EVENTS"
EVENTS_ALL: Final = f"{PREFIX}.events.>"
EVENTS_TEMPLATE: Final = f"{PREFIX}.events.{{run_id}}"

# Request/reply endpoints.
HISTORY_APPEND: Final = f"{PREFIX}.history.append"
HISTORY_LOAD: Final = f"{PREFIX}.history.load"
MEMORY_STORE: Final = f"{PREFIX}.memory.store"
MEMORY_SEARCH: Final = f"{PREFIX}.memory.search"
COMPACTION_COMPACT: Final = f"{PREFIX}.compaction.compact"
MODEL_COMPLETE: Final = f"{PREFIX}.model.complete"
TOOLS_LIST: Final = f"{PREFIX}.tools.list"
TOOL_INVOKE_TEMPLATE: Final = f"{PREFIX}.tools.{{name}}.invoke"

# History storage: one subject per tenant and session inside one stream.
HISTORY_STREAM: Final = "RUNBUS_HISTORY"
HISTORY_LOG_ALL: Final = f"{PREFIX}.hist.>"


def runs(agent: str) -> str:
    """Subject a run request for `agent` is published on."""
    return f"{PREFIX}.runs.{agent}"


def events(run_id: str) -> str:
    """Subject the events of `run_id` are published on."""
    return f"{PREFIX}.events.{run_id}"


def tool_invoke(name: str) -> str:
    """Subject the tool `name` answers on."""
    return f"{PREFIX}.tools.{name}.invoke"


def history_log(tenant: str, session_id: str) -> str:
    """Storage subject of one session's messages (internal to the history service)."""
    return f"{PREFIX}.hist.{tenant}.{session_id}"
