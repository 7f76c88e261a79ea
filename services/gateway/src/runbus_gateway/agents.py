"""Agent definitions: TOML files decoded into frozen Structs at start."""

import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated

import msgspec

from runbus.messages import Identifier
from runbus.messages.memory import SearchScope

from .errors import GatewayConfigError


class MemoryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    enabled: bool = False
    """Search long-term memory before the first model call."""
    search_scope: SearchScope = "user"
    """Where searches look (storage always uses the full scope)."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=50)] = 5
    """Memories given to the model at most."""
    store_user_statements: bool = False
    """Store the user's input at the end of the run (never the assistant's claims)."""


class CompactionPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Prompt budget handed to the compaction service."""


class AgentSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Identifier
    """Name runs address the agent by (`runbus.runs.<name>`)."""
    instructions: str
    """System prompt."""
    model: str
    """Model route, e.g. `offline` or `scripted/<script>`."""
    description: str = ""
    tools: list[str] = []
    """Tools the model may call; anything else it asks for is refused."""
    max_iterations: Annotated[int, msgspec.Meta(ge=1, le=100)] = 8
    """Model calls per run at most."""
    memory: MemoryPolicy = MemoryPolicy()
    compaction: CompactionPolicy = CompactionPolicy()


def load_agents(folder: Path | None = None) -> dict[str, AgentSpec]:
    """Every `*.toml` in `folder` (default: the packaged demo agents), by name."""
    files = (
        sorted(folder.glob("*.toml"))
        if folder is not None
        else [
            Path(str(f))
            for f in resources.files(__package__).joinpath("agents").iterdir()
            if f.name.endswith(".toml")
        ]
    )
    agents: dict[str, AgentSpec] = {}
    for file in files:
        try:
            agent = msgspec.convert(tomllib.loads(file.read_text()), AgentSpec)
        except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
            raise GatewayConfigError(f"agent file {str(file)!r}: {exc}") from None
        if agent.name in agents:
            raise GatewayConfigError(f"agent {agent.name!r} is defined twice")
        agents[agent.name] = agent
    return agents
