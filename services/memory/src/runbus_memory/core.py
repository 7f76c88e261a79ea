"""Memory rules without a bus: storage scope from trusted headers, search filters per scope."""

import uuid
from dataclasses import dataclass
from datetime import datetime

from runbus.headers import RunContext
from runbus.messages.memory import SearchScope

from .errors import MissingIdentity

_NAMESPACE = uuid.UUID("6f1c2a52-8f0e-4e57-9b1e-5b0f3c2d9a41")


@dataclass(frozen=True)
class StorageScope:
    """What a memory belongs to. Taken from trusted headers only."""

    tenant: str
    user_id: str
    session_id: str
    agent_id: str

    @classmethod
    def from_context(cls, ctx: RunContext) -> "StorageScope":
        for prop in ("tenant", "user_id"):
            if not ctx.prop(prop):
                raise MissingIdentity(prop)
        return cls(
            tenant=ctx.prop("tenant"),
            user_id=ctx.prop("user_id"),
            session_id=ctx.session_id,
            agent_id=ctx.agent,
        )

    def search_filter(self, scope: SearchScope) -> dict[str, str]:
        """Payload fields a search must match; always inside the caller's tenant."""
        match scope:
            case "tenant":
                return {"tenant": self.tenant}
            case "user":
                return {"tenant": self.tenant, "user_id": self.user_id}
            case "session":
                return {
                    "tenant": self.tenant,
                    "user_id": self.user_id,
                    "session_id": self.session_id,
                }
            case "agent":
                return {"tenant": self.tenant, "user_id": self.user_id, "agent_id": self.agent_id}


@dataclass(frozen=True)
class MemoryRecord:
    memory_id: str
    text: str
    scope: StorageScope
    created_at: datetime

    def payload(self) -> dict[str, str]:
        return {
            "text": self.text,
            "tenant": self.scope.tenant,
            "user_id": self.scope.user_id,
            "session_id": self.scope.session_id,
            "agent_id": self.scope.agent_id,
            "created_at": self.created_at.isoformat(),
        }

    @classmethod
    def from_payload(cls, memory_id: str, payload: dict[str, object]) -> "MemoryRecord":
        return cls(
            memory_id=memory_id,
            text=str(payload["text"]),
            scope=StorageScope(
                tenant=str(payload["tenant"]),
                user_id=str(payload["user_id"]),
                session_id=str(payload.get("session_id", "")),
                agent_id=str(payload.get("agent_id", "")),
            ),
            created_at=datetime.fromisoformat(str(payload["created_at"])),
        )


def memory_id(scope: StorageScope, text: str) -> str:
    """Same statement, same owner → same id, so storing it twice keeps one memory."""
    key = "\0".join((scope.tenant, scope.user_id, scope.session_id, scope.agent_id, text.strip()))
    return str(uuid.uuid5(_NAMESPACE, key))
