"""Header names and the run context they carry from hop to hop.

Identity travels only as `rb-prop-*` headers that the gateway sets after authentication;
downstream services read user and tenant from here, never from a body.
"""

import math
import time
from collections.abc import Mapping
from typing import Final

import msgspec

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
RUN_ID: Final = "rb-run-id"
SESSION_ID: Final = "rb-session-id"
AGENT: Final = "rb-agent"
PROP_PREFIX: Final = "rb-prop-"
DEADLINE: Final = "rb-deadline"
ERROR: Final = "rb-error"
AUTH: Final = "rb-auth"
MSG_ID: Final = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQUENCE: Final = "Nats-Expected-Last-Subject-Sequence"
"""On a JetStream publish: store only if the subject's last message has this sequence."""
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: Final = "Nats-Expected-Last-Subject-Sequence-Subject"
"""The subject whose last sequence `EXPECTED_LAST_SUBJECT_SEQUENCE` checks, when it is not the
one published to (nats-server 2.11+)."""
PROGRESS: Final = "rb-progress"
"""Subject the serving side sends heartbeats to while it works on a progress-aware request."""


class RunContext(msgspec.Struct, frozen=True, kw_only=True):
    """The run-scoped values every hop forwards: ids, trusted properties and the deadline."""

    run_id: str = ""
    session_id: str = ""
    agent: str = ""
    props: dict[str, str] = {}
    """Trusted run properties (user_id, tenant, request_id, …)."""
    deadline: float | None = None
    """Absolute deadline, seconds since the epoch."""
    auth: str = ""
    """The caller's `rb-auth` credential, as received; never forwarded by `to_headers`."""
    progress: str = ""
    """Where this hop's caller listens for heartbeats (`rb-progress`); never forwarded."""

    def to_headers(self) -> dict[str, str]:
        headers = {f"{PROP_PREFIX}{k}": v for k, v in self.props.items()}
        if self.run_id:
            headers[RUN_ID] = self.run_id
        if self.session_id:
            headers[SESSION_ID] = self.session_id
        if self.agent:
            headers[AGENT] = self.agent
        if self.deadline is not None:
            headers[DEADLINE] = f"{self.deadline:.3f}"
        return headers

    @classmethod
    def from_headers(cls, headers: Mapping[str, str] | None) -> "RunContext":
        if not headers:
            return cls()
        props = {k[len(PROP_PREFIX) :]: v for k, v in headers.items() if k.startswith(PROP_PREFIX)}
        deadline: float | None = None
        if raw := headers.get(DEADLINE):
            try:
                deadline = float(raw)
            except ValueError:
                deadline = None
            if deadline is not None and not math.isfinite(deadline):
                deadline = None
        return cls(
            run_id=headers.get(RUN_ID, ""),
            session_id=headers.get(SESSION_ID, ""),
            agent=headers.get(AGENT, ""),
            props=props,
            deadline=deadline,
            auth=headers.get(AUTH, ""),
            progress=headers.get(PROGRESS, ""),
        )

    def time_left(self) -> float | None:
        """Seconds until the deadline (may be negative), or None without one."""
        return None if self.deadline is None else self.deadline - time.time()

    def prop(self, name: str) -> str:
        """A trusted property, or "" when the gateway did not set it."""
        return self.props.get(name, "")
