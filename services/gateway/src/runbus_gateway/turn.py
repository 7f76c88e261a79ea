"""What one run's passes share."""

from dataclasses import dataclass

from runbus.headers import RunContext
from runbus.messages import ChatMessage, ToolSpec

from .agents import AgentSpec
from .checkpoints import Checkpointer, Progress
from .events import RunEvents
from .harness.runtime import Harness
from .harness.state import SessionState
from .run_ports import RunObserver, RunPorts


@dataclass
class Turn:
    """Everything one run's passes share."""

    agent: AgentSpec
    ctx: RunContext
    ports: RunPorts
    harness: Harness
    state: SessionState
    tools: list[ToolSpec]
    prompt: list[ChatMessage]
    progress: Progress
    checkpoint: Checkpointer
    events: RunEvents
    observer: RunObserver | None = None

    async def waiting(self, waiting: bool) -> None:
        if self.observer is not None:
            await self.observer.on_waiting(waiting)
